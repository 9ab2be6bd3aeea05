"""The rollout pods of a Kubernetes run as its pod watch reports them, and waiting on one.

:meth:`RolloutPods.on_pod` is the run's :class:`~infra.kube.PodWatcher` callback; a rollout
waits (:meth:`RolloutPods.wait`) until its pod says what it waits for, or raises
:class:`~schemas.errors.InfrastructureError` when the pod cannot get there: it is stuck (an image
pull, an unschedulable pod) for ``startup_grace_s``, failed, deleted, past its deadline (plus a
minute) without its node having ended it, or the run was cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from orchestrator import kube_status as status
from schemas.errors import InfrastructureError

DEADLINE_SLACK_S = 60.0  # past the pod's activeDeadlineSeconds, its node has had time to end it


@dataclass
class PodState:
    """What the watch has said about one rollout's pod."""

    pod: dict[str, Any] | None = None
    created: float | None = None  # monotonic time the create call returned
    deadline: float | None = None  # monotonic time by which the pod must have ended
    deleted: bool = False
    stuck_since: float | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)


class RolloutPods:
    """The pods, by name, of the rollouts waiting now in ``namespace``."""

    def __init__(self, namespace: str, startup_grace_s: float, cancelled: threading.Event) -> None:
        self.ns = namespace
        self.startup_grace_s = startup_grace_s
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self._states: dict[str, PodState] = {}
        self.watch_lags: list[float] = []  # per pod: its create call's return to its first event

    @contextmanager
    def track(self, name: str) -> Iterator[PodState]:
        """The state of the pod ``name``, fed by the watch while the block runs."""
        state = PodState()
        with self._lock:
            self._states[name] = state
        try:
            yield state
        finally:
            with self._lock:
                self._states.pop(name, None)

    def created(self, state: PodState, deadline_s: float) -> None:
        """The create call for ``state``'s pod returned; it must end within ``deadline_s``."""
        with state.changed:
            state.created = time.monotonic()
            state.deadline = state.created + deadline_s + DEADLINE_SLACK_S
            if state.pod is not None:  # the watch was faster than the create's answer
                self.watch_lags.append(0.0)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._states)

    def wake_all(self) -> None:
        """Wake every waiting rollout (to see that the run was cancelled)."""
        with self._lock:
            states = list(self._states.values())
        for state in states:
            with state.changed:
                state.changed.notify_all()

    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        with self._lock:
            state = self._states.get(pod["metadata"]["name"])
        if state is None:
            return
        with state.changed:
            if kind == "DELETED":
                state.deleted = True
            else:
                if state.pod is None and state.created is not None:
                    self.watch_lags.append(time.monotonic() - state.created)
                state.pod = pod
            state.changed.notify_all()

    def wait(self, name: str, state: PodState, done: Callable[[dict[str, Any]], Any]) -> Any:
        """Wait until ``done(pod)`` returns something (returned), or the pod cannot get there
        (see the module docstring)."""
        with state.changed:
            while True:
                self._refuse_ended(name, state)
                pod = state.pod
                if pod is not None:
                    result = done(pod)
                    if result is not None:
                        return result
                    self._refuse_failed(name, pod)
                    self._refuse_stuck(name, state, pod)
                state.changed.wait(timeout=1.0)

    def _refuse_ended(self, name: str, state: PodState) -> None:
        if self._cancelled.is_set():
            raise InfrastructureError("cancelled")
        if state.deadline is not None and time.monotonic() > state.deadline:
            raise InfrastructureError(
                f"pod {self.ns}/{name} is past its activeDeadlineSeconds and its node "
                "has not ended it (is the node's kubelet down?)"
            )
        if state.deleted:
            raise InfrastructureError(f"pod {self.ns}/{name} was deleted")

    def _refuse_failed(self, name: str, pod: dict[str, Any]) -> None:
        seen = pod.get("status") or {}
        if seen.get("phase") == "Failed":
            raise InfrastructureError(
                f"pod {self.ns}/{name} failed: {seen.get('reason') or ''} "
                f"{seen.get('message') or ''}".strip()
            )

    def _refuse_stuck(self, name: str, state: PodState, pod: dict[str, Any]) -> None:
        why = status.stuck(pod)
        if why is None:
            state.stuck_since = None
        elif state.stuck_since is None:
            state.stuck_since = time.monotonic()
        elif time.monotonic() - state.stuck_since >= self.startup_grace_s:
            raise InfrastructureError(f"pod {self.ns}/{name}: {why}")
