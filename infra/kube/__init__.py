"""Adapters to a Kubernetes API server (the official ``kubernetes`` client): a client from a
kubeconfig or the pod's service account, and a pod watcher that survives expiry."""

from infra.kube.client import api_client
from infra.kube.watch import PodWatcher, WatchStats

__all__ = ["PodWatcher", "WatchStats", "api_client"]
