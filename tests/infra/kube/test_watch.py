"""The pod watcher on a real API server: a forced expiry (410 Gone, after etcd compacted the
version it resumes from) is survived without losing a change; an API server restart is
survived with backoff."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from infra.kube import PodWatcher
from infra.local.kube import LocalKube


@pytest.fixture(scope="module")
def kube() -> Iterator[LocalKube]:
    # Without the watch cache, a watch reads etcd directly: a compacted version is a real 410.
    with LocalKube(apiserver_args=["--watch-cache=false"]) as local:
        yield local


class Seen:
    """The last state of each pod the watcher handed on."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: set[str] = set()
        self.kinds: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, kind: str, pod: dict[str, Any]) -> None:
        with self.cond:
            name = pod["metadata"]["name"]
            self.kinds.append(kind)
            if kind == "DELETED":
                self.deleted.add(name)
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
                self.deleted.discard(name)
            self.cond.notify_all()

    def wait(self, what: str, probe: Any, timeout: float = 30.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: probe(self), timeout), f"watcher never saw {what}"


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "w"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def _phase(seen: Seen, name: str) -> str | None:
    pod = seen.pods.get(name)
    return None if pod is None else (pod.get("status") or {}).get("phase")


def test_a_compacted_resume_version_is_survived_without_losing_a_change(kube: LocalKube) -> None:
    from kubernetes import client

    api = kube.api()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "w"}})
    core.create_namespaced_pod("w", _pod("a"))
    core.create_namespaced_pod("w", _pod("gone"))
    seen = Seen()
    watcher = PodWatcher(api, "w", "app=w", seen, watch_timeout_s=30)
    watcher.start()
    seen.wait("both pods running", lambda s: _phase(s, "a") == _phase(s, "gone") == "Running")
    watcher.stop()
    resume_from = watcher.resource_version
    assert resume_from is not None and watcher.stats.expired == 0

    # While nobody watches: a new pod, a deletion, and history compacted past resume_from.
    core.create_namespaced_pod("w", _pod("b"))
    core.delete_namespaced_pod("gone", "w", grace_period_seconds=0)
    for n in range(20):  # move etcd's revision on
        core.create_namespaced_config_map("w", {"metadata": {"name": f"c{n}"}})
    time.sleep(1.0)  # let kwok run pod b
    kube.compact_etcd()

    again = PodWatcher(api, "w", "app=w", seen, watch_timeout_s=30)
    again.start(resource_version=resume_from, known=watcher.known)
    try:
        seen.wait("pod b running", lambda s: _phase(s, "b") == "Running")
        seen.wait("pod gone deleted", lambda s: "gone" in s.deleted)
        assert again.stats.expired >= 1 and again.stats.lists >= 1
        # And the watch goes on after the re-list: a later change arrives as an event.
        core.patch_namespaced_pod("a", "w", {"metadata": {"annotations": {"k": "v"}}})
        seen.wait(
            "the annotation",
            lambda s: (s.pods["a"]["metadata"].get("annotations") or {}) == {"k": "v"},
        )
    finally:
        again.stop()
    assert "SYNC" in seen.kinds and "MODIFIED" in seen.kinds


def test_an_api_server_that_goes_away_is_retried_with_backoff(kube: LocalKube) -> None:
    from kubernetes import client

    api = kube.api()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "r"}})
    seen = Seen()
    watcher = PodWatcher(api, "r", "app=w", seen, watch_timeout_s=30, max_backoff_s=1.0)
    watcher.start()
    assert watcher.wait_synced(30)
    kube.restart("kube-apiserver", down_s=2.0)
    try:
        core.create_namespaced_pod(
            "r", {**_pod("after"), "metadata": {"name": "after", "labels": {"app": "w"}}}
        )
        seen.wait("the pod created after the restart", lambda s: "after" in s.pods, timeout=60)
        assert watcher.stats.errors >= 1
    finally:
        watcher.stop()
