"""Verified rollouts' Pods and Secrets, deleted in batches.

A rollout that ended verified has nothing left to give: its containers have exited (a finished
pod holds no node resources the scheduler counts) and its termination messages and logs were
read. Deleting its Pod and its Secret one by one is two API writes each, half of what the
control plane does for a rollout. The reaper takes them in batches instead: one
``deletecollection`` per kind for every rollout that finished within ``linger_s`` of the first
of them (or as soon as ``batch`` have), selected by their ``openforge.dev/rollout`` labels. At a
launch of many rollouts that is about two writes per rollout (its Secret and Pod created) plus
two per batch; one rollout alone still costs four. A rollout that did not end verified (an
infrastructure failure, a cancellation) is deleted at once by the backend, not here: its pod
may still run. :meth:`close` deletes what is pending.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from orchestrator.kube_api import KubeApi
from orchestrator.kube_objects import ROLLOUT
from schemas.errors import InfrastructureError

log = logging.getLogger(__name__)


class Reaper:
    """Batches of finished rollouts' Pods and Secrets, deleted (see the module docstring)."""

    def __init__(
        self, k8s: KubeApi, namespace: str, selector: str, batch: int = 64, linger_s: float = 2.0
    ) -> None:
        self.k8s, self.ns, self.selector = k8s, namespace, selector
        self.batch, self.linger_s = batch, linger_s
        self._pending: list[str] = []  # their ROLLOUT label values
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def finished(self, rollout_label: str) -> None:
        """A verified rollout's objects are to go (within ``linger_s``)."""
        with self._lock:
            self._pending.append(rollout_label)
            full = len(self._pending) >= self.batch
            if not full and self._timer is None:
                self._timer = threading.Timer(self.linger_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if full:
            self.flush()

    def flush(self) -> None:
        """Delete every pending rollout's Pod and Secret now (two calls a batch)."""
        with self._lock:
            taken, self._pending = self._pending, []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for start in range(0, len(taken), self.batch):
            self._delete(taken[start : start + self.batch])

    def _delete(self, labels: list[str]) -> None:
        selector = f"{self.selector},{ROLLOUT} in ({','.join(sorted(set(labels)))})"
        core: Any = self.k8s.core
        with contextlib.suppress(InfrastructureError):  # the run's anchor takes them at close
            self.k8s.call(core.delete_collection_namespaced_pod, self.ns,
                          label_selector=selector, grace_period_seconds=0)  # fmt: skip
        with contextlib.suppress(InfrastructureError):
            self.k8s.call(core.delete_collection_namespaced_secret, self.ns,
                          label_selector=selector)  # fmt: skip
        log.debug("deleted the pods and secrets of %d verified rollouts", len(labels))

    def close(self) -> None:
        self.flush()
