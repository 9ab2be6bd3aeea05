"""Verified rollouts' Pods and Secrets deleted in batches, on a real API server: one
deletecollection per kind for every rollout that finished within the linger (or a full batch at
once), by their rollout labels, and nothing else of the run."""

from __future__ import annotations

import time
from typing import Any

import pytest

from infra.local.kube import LocalKube
from orchestrator.kube_api import KubeApi
from orchestrator.kube_objects import ROLE, ROLLOUT, RUN
from orchestrator.kube_reaper import Reaper

NS = "reaper"
RUN_LABELS = {RUN: "r-reaper-test", ROLE: "rollout"}
SELECTOR = ",".join(f"{k}={v}" for k, v in RUN_LABELS.items())


@pytest.fixture(scope="module")
def k8s(local_kube: LocalKube) -> KubeApi:
    api = KubeApi(local_kube.api())
    api.core.create_namespace({"metadata": {"name": NS}})
    return api


def _rollout(k8s: KubeApi, label: str) -> None:
    labels = {**RUN_LABELS, ROLLOUT: label}
    meta = {"name": label, "namespace": NS, "labels": labels}
    k8s.create(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {}})
    pod = {"containers": [{"name": "c", "image": "openforge:test"}]}
    k8s.create(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod})


def _left(k8s: KubeApi) -> set[str]:
    core: Any = k8s.core
    pods = core.list_namespaced_pod(NS, label_selector=SELECTOR).items
    secrets = core.list_namespaced_secret(NS, label_selector=SELECTOR).items
    return {f"pod/{o.metadata.name}" for o in pods} | {f"secret/{o.metadata.name}" for o in secrets}


def _wait(k8s: KubeApi, expected: set[str], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := _left(k8s)) != expected:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)


@pytest.mark.parametrize(("batch", "calls"), [(64, 2), (2, 6)])
def test_finished_rollouts_go_in_batches_and_the_others_stay(
    k8s: KubeApi, batch: int, calls: int
) -> None:
    finished = [f"done-{batch}-{n}" for n in range(5)]
    running = f"running-{batch}"
    for label in [*finished, running]:
        _rollout(k8s, label)
    reaper = Reaper(k8s, NS, SELECTOR, batch=batch, linger_s=0.5)
    before = k8s.calls
    for label in finished:
        reaper.finished(label)
    _wait(k8s, {f"pod/{running}", f"secret/{running}"})
    assert k8s.calls - before == calls  # per kind: one call a batch (5 = 2 + 2 + 1 with 2)
    reaper.close()
    assert k8s.calls - before == calls  # nothing was pending
    k8s.core.delete_namespaced_pod(running, NS, grace_period_seconds=0)
    k8s.core.delete_namespaced_secret(running, NS)
    _wait(k8s, set())
