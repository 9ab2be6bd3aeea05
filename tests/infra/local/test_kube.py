"""The local control plane: every component up, a pod scheduled and driven by kwok, a Job run
by the controller-manager, and nothing left running or on disk after stop."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from infra.local.kube import LocalKube
from infra.local.process import leftover_processes


def _wait(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_pod_and_a_job_run_to_completion_and_stop_leaves_nothing(tmp_path: Path) -> None:
    from kubernetes import client

    before = set(leftover_processes())
    with LocalKube(tmp_path / "kube") as kube:
        api = kube.api()
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        assert client.VersionApi(api).get_code().git_version == "v1.37.2"
        (node,) = core.list_node().items
        assert node.status.allocatable["pods"] == "1100"
        core.create_namespace({"metadata": {"name": "t"}})
        _wait(
            "the default service account", lambda: core.list_namespaced_service_account("t").items
        )
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        core.create_namespaced_pod("t", pod)
        running = _wait(
            "a running pod",
            lambda: (p := core.read_namespaced_pod("p", "t")).status.phase == "Running" and p,
        )
        assert running.spec.node_name == "kwok-node-0" and running.status.pod_ip
        job = {
            "metadata": {"name": "j"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "x"}]}}},
        }  # fmt: skip
        batch.create_namespaced_job("t", job)
        _wait("the job's success", lambda: batch.read_namespaced_job("j", "t").status.succeeded)
        pids = set(leftover_processes()) - before
        assert len(pids) >= 5  # etcd, apiserver, controller-manager, scheduler, kwok
    assert set(leftover_processes()) - before == set()
    assert (tmp_path / "kube" / "logs" / "kube-apiserver.log").exists()  # a given root is kept


def test_a_fresh_root_is_removed_on_stop() -> None:
    with LocalKube() as kube:
        root = kube.root
        assert kube.kubeconfig.exists()
    assert not root.exists()
