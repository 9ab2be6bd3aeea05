"""The Kubernetes rollout backend on a real API server whose nodes are kwok's: what needs no
container to run (an image that cannot be pulled, an unschedulable pod, cancellation, a task
the backend cannot lay out, the NetworkPolicy's shape). Pods that run, their confinement and
their rewards: test_kube_real_node.py, on the local cluster's real node."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.harnesses import NoOp
from infra.harnesses.base import Harness
from infra.local.kube import LocalKube
from infra.local.kwok_stages import MISSING_IMAGE
from infra.tasks import Task, load_task
from openforge.testing.proxy import RunningProxy, proxy_config, running_proxy
from orchestrator.kube_objects import network_policy
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status
from schemas.errors import ConfigError, SetupError
from tests.orchestrator.conftest import wait_gone

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "examples" / "echo-words" / "echo-about"
NS = "openforge-rollouts"
NO_UPSTREAM = "http://127.0.0.1:9"  # for harnesses that call no model


@pytest.fixture(scope="module")
def core(local_kube: LocalKube) -> Any:
    from kubernetes import client

    api = client.CoreV1Api(local_kube.api())
    if not any(n.metadata.name == NS for n in api.list_namespace().items):
        api.create_namespace({"metadata": {"name": NS}})
    return api


@dataclass
class KubeJob:
    proxy: RunningProxy
    backend: KubernetesBackend
    orchestrator: Orchestrator
    core: Any

    def start(self, tasks: list[Task], n: int = 1) -> Callable[[], list[RolloutOutcome]]:
        """Run the plan in a thread; returns a function that waits for the records."""
        out: list[list[RolloutOutcome]] = []
        planned = plan(tasks, n, run_id=self.backend.run_id)
        thread = threading.Thread(target=lambda: out.append(self.orchestrator.run(planned)))
        thread.start()

        def join() -> list[RolloutOutcome]:
            thread.join(timeout=120)
            assert not thread.is_alive() and out, "the orchestrator did not finish"
            return out[0]

        return join

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(NS, label_selector=self.backend.selector).items)

    def wait_pods(self, n: int, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.pods()
            if len(pods) >= n:
                return pods
            time.sleep(0.2)
        raise AssertionError(f"fewer than {n} rollout pods after {timeout:.0f}s")

    def annotate(self, name: str, key: str, value: str) -> None:
        self.core.patch_namespaced_pod(name, NS, {"metadata": {"annotations": {key: value}}})


@contextmanager
def kube_job(
    tmp: Path,
    local_kube: LocalKube,
    core: Any,
    chosen: Harness,
    tiny_model_dir: Path,
    upstream: str = NO_UPSTREAM,
    grace: float = 20.0,
    concurrency: int = 4,
) -> Iterator[KubeJob]:
    kw = {} if upstream != NO_UPSTREAM else {"max_model_len": 4096, "upstream_model": "tiny"}
    config = proxy_config(upstream, tmp / "proxy", tokenizer=tiny_model_dir, **kw)
    with running_proxy(config) as proxy:
        options = KubeOptions(
            kubeconfig=local_kube.kubeconfig,
            pod=PodSettings(namespace=NS, proxy_url=proxy.url, harness_image="openforge:test"),
            startup_grace_s=grace,
        )
        backend = KubernetesBackend(options)
        orch = Orchestrator(
            backend, chosen, proxy.admin, RunDir(tmp / "run"),
            OrchestratorConfig(concurrency=concurrency, max_attempts=1, backoff_s=0.1),
        )  # fmt: skip
        try:
            yield KubeJob(proxy, backend, orch, core)
        finally:
            backend.close()


def test_an_image_that_cannot_be_pulled_and_an_unschedulable_pod_fail_fast(
    local_kube: LocalKube, core: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    missing = _copy_task(tmp_path / "missing", f'cpus = 1\ndocker_image = "{MISSING_IMAGE}"')
    huge = _copy_task(tmp_path / "huge", "cpus = 64")  # the node has 32
    with kube_job(tmp_path / "j", local_kube, core, NoOp(), tiny_model_dir, grace=5.0) as job:
        start = time.monotonic()
        records = job.start([missing, huge])()
        took = time.monotonic() - start
        run_label = job.backend.labels["openforge.dev/run"]
    by_task = {r.task_id: r for r in records}
    assert {r.status for r in records} == {Status.INFRA_FAILED}
    assert "ErrImagePull" in by_task[missing.id].message
    assert "unschedulable" in by_task[huge.id].message
    assert took < 60, f"reported after {took:.0f}s"
    wait_gone(core, NS, run_label)


def test_cancellation_deletes_everything_the_job_created(
    local_kube: LocalKube, core: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(ECHO)
    with kube_job(tmp_path, local_kube, core, NoOp(), tiny_model_dir) as job:
        join = job.start([task], n=3)
        job.wait_pods(3)
        run_label = job.backend.labels["openforge.dev/run"]
        job.orchestrator.cancel()
        records = join()
        assert {r.status for r in records} == {Status.CANCELLED}
    wait_gone(core, NS, run_label)


def test_a_task_the_backend_cannot_lay_out_is_refused_before_anything_starts(
    local_kube: LocalKube, core: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pip = _copy_task(tmp_path / "pip", "cpus = 1")
    (pip.path / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nWORKDIR /app\nRUN pip install requests\n"
    )
    with kube_job(tmp_path / "j", local_kube, core, NoOp(), tiny_model_dir) as job:
        with pytest.raises(ConfigError, match="does not build images"):
            job.orchestrator.check([load_task(pip.path)])
        assert job.pods() == []


def test_the_network_policy_spans_a_proxy_pools_ports() -> None:
    """A pool's front and its workers on consecutive ports: egress reaches all of them."""
    labels = {"app.kubernetes.io/name": "openforge-proxy"}
    one = network_policy(NS, "openforge", labels, 8000)
    pool = network_policy(NS, "openforge", labels, 8000, proxy_ports=5)
    assert one["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert pool["spec"]["egress"][0]["ports"] == [
        {"protocol": "TCP", "port": 8000, "endPort": 8004}
    ]
    assert pool["spec"]["egress"][1] == one["spec"]["egress"][1]  # DNS as before


def test_a_missing_namespace_is_made_by_an_account_that_may(
    local_kube: LocalKube, core: Any
) -> None:
    """`rollouts run --backend kubernetes` on the local cluster (as the services command starts
    it) needs no kubectl: the run makes its namespace (issue 52)."""
    ns = f"of-fresh-{uuid.uuid4().hex[:8]}"
    backend = KubernetesBackend(_options(local_kube.kubeconfig, ns))
    try:
        backend.prepare()
        assert core.read_namespace(ns).metadata.labels["app.kubernetes.io/managed-by"]
        assert core.list_namespaced_config_map(ns, label_selector="openforge.dev/role=run").items
    finally:
        backend.close()
        core.delete_namespace(ns)


def test_an_account_that_may_not_make_the_namespace_is_told_what_to_run(
    local_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    ns = f"of-missing-{uuid.uuid4().hex[:8]}"
    kubeconfig = _reader_account(local_kube, core, tmp_path)  # may read namespaces, not make them
    backend = KubernetesBackend(_options(kubeconfig, ns))
    try:
        with pytest.raises(SetupError, match=f"kubectl create namespace {ns}"):
            backend.prepare()
    finally:
        backend.close()
    assert ns not in {n.metadata.name for n in core.list_namespace().items}


def _options(kubeconfig: Path, ns: str) -> KubeOptions:
    pod = PodSettings(namespace=ns, proxy_url=NO_UPSTREAM, harness_image="openforge:test")
    return KubeOptions(kubeconfig=kubeconfig, pod=pod)


def _reader_account(kube: LocalKube, core: Any, tmp: Path) -> Path:
    """A service account allowed to get namespaces and nothing else, as a kubeconfig."""
    from kubernetes import client

    name = f"ns-reader-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_service_account("default", {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(kube.api())
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]})  # fmt: skip
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    })  # fmt: skip
    token = core.create_namespaced_service_account_token(
        name, "default", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    path = tmp / "reader.kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: local\n  cluster: {{server: '{kube.server}', "
        f"certificate-authority: '{kube.pki / 'ca.crt'}'}}\n"
        f"users:\n- name: reader\n  user: {{token: '{token}'}}\n"
        "contexts:\n- name: local\n  context: {cluster: local, user: reader}\n"
        "current-context: local\n"
    )
    return path


def _copy_task(root: Path, cpus_line: str) -> Task:
    """echo-about under ``root``, with its ``cpus = 1`` line replaced by ``cpus_line``."""
    import shutil

    shutil.copytree(ECHO, root)
    toml = (root / "task.toml").read_text()
    assert "cpus = 1\n" in toml
    (root / "task.toml").write_text(toml.replace("cpus = 1\n", cpus_line + "\n"))
    return load_task(root)
