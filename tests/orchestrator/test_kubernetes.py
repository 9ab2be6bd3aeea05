"""The Kubernetes rollout backend on a real API server (kwok plays the nodes, so no container
runs: the test plays the harness and the verifier through kwok's stages, see
:mod:`infra.local.kwok_stages`). Real proxy, real vLLM, real event log, real Beam pipeline."""

from __future__ import annotations

import base64
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.harnesses import NoOp, harness
from infra.harnesses.base import Harness
from infra.local.kube import LocalKube
from infra.local.kwok_stages import AGENT_MESSAGE, MISSING_IMAGE, VERIFIER_MESSAGE
from infra.local.vllm import VLLMServer
from infra.tasks import Task, load_task
from openforge.testing.proxy import RunningProxy, proxy_config, running_proxy
from orchestrator.kube_objects import ROLE, ROLLOUT_ID, network_policy
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status
from pipeline.jobs import Outputs, run_streaming
from schemas.archive import read_archive
from schemas.episode import Episode
from schemas.errors import ConfigError

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


def _run_objects(core: Any, run_label: str) -> list[str]:
    sel = f"openforge.dev/run={run_label}"
    return [
        f"{kind}/{o.metadata.name}"
        for kind, items in (
            ("pod", core.list_namespaced_pod(NS, label_selector=sel).items),
            ("secret", core.list_namespaced_secret(NS, label_selector=sel).items),
            ("configmap", core.list_namespaced_config_map(NS, label_selector=sel).items),
        )
        for o in items
    ]


def _wait_gone(core: Any, run_label: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    left: list[str] = []
    while time.monotonic() < deadline:
        left = _run_objects(core, run_label)
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"left behind after {timeout:.0f}s: {left}")


def _container(pod: Any, name: str) -> Any:
    return next(c for c in [*pod.spec.init_containers, *pod.spec.containers] if c.name == name)


def test_a_rollout_pod_is_confined_and_its_reward_becomes_an_episode(
    local_kube: LocalKube, core: Any, vllm_server: VLLMServer, tiny_model_dir: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    task = load_task(ECHO)
    with kube_job(tmp_path, local_kube, core, harness("agent"), tiny_model_dir,
                  upstream=vllm_server.base_url) as job:  # fmt: skip
        join = job.start([task])
        (pod,) = job.wait_pods(1)
        name = pod.metadata.name
        run_label = job.backend.labels["openforge.dev/run"]

        # The pod: no token, no service links, a deadline, non-root everywhere, the task's
        # resources, the tests only in the verifier, the rollout's Secret only in the agent.
        spec = pod.spec
        assert spec.automount_service_account_token is False
        assert spec.enable_service_links is False and spec.restart_policy == "Never"
        assert spec.active_deadline_seconds == 60 + 30 + 300
        assert spec.security_context.run_as_non_root is True
        order = [c.name for c in spec.init_containers] + [c.name for c in spec.containers]
        assert order == ["workspace", "tools", "agent", "verifier"]  # python:3.12-slim + tools
        for c in [*spec.init_containers, *spec.containers]:
            sc = c.security_context
            assert sc.run_as_non_root and sc.allow_privilege_escalation is False
            assert sc.read_only_root_filesystem and sc.capabilities.drop == ["ALL"]
            # task.toml: cpus = 1, memory_mb = 1024, storage_mb = 64 (as the API server writes them)
            assert c.resources.limits == {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "64Mi"}
            assert c.resources.requests == c.resources.limits
        assert _container(pod, "agent").image == "python:3.12-slim"
        mounts = {c.name: {m.name for m in c.volume_mounts}
                  for c in [*spec.init_containers, *spec.containers]}  # fmt: skip
        assert [n for n, m in mounts.items() if "tests" in m or "tests-files" in m] == ["verifier"]
        assert [n for n, m in mounts.items() if "rollout" in m] == ["agent"]
        secret_users = [
            c.name
            for c in [*spec.init_containers, *spec.containers]
            for e in (c.env or [])
            if e.value_from and e.value_from.secret_key_ref
        ]
        assert set(secret_users) == {"agent"}
        assert pod.metadata.annotations[ROLLOUT_ID].startswith(job.backend.run_id)
        policy = job.backend.net.read_namespaced_network_policy("openforge-rollouts", NS)
        assert policy.spec.pod_selector.match_labels == {ROLE: "rollout"}
        assert policy.spec.ingress is None or policy.spec.ingress == []
        assert [p.port for rule in policy.spec.egress for p in rule.ports] == [8000, 53, 53]

        # Play the harness: what the pod's agent gets is its Secret (the key) and its command.
        secret = core.read_namespaced_secret(name, NS)
        key = base64.b64decode(secret.data["env.OPENFORGE_API_KEY"]).decode()
        argv = shlex.split(_container(pod, "agent").command[2].split("timeout -k 5 60 ")[1])
        base = argv[argv.index("--base-url") + 1]
        assert base.startswith(job.proxy.url)
        resp = httpx.post(
            f"{base}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "tiny", "max_tokens": 8, "temperature": 0,
                  "messages": [{"role": "user", "content": "Write the word about."}]},
            timeout=60,
        )  # fmt: skip
        assert resp.status_code == 200, resp.text
        job.annotate(name, AGENT_MESSAGE, json.dumps({"exit_code": 0}))
        job.annotate(name, VERIFIER_MESSAGE, '{"exit_code": 0, "file": "reward.txt"}\n1\n')
        (record,) = join()
        assert record.status is Status.VERIFIED and record.reward == 1.0, record
        job.proxy.flush()
        log_url = job.proxy.config.log_url
        assert _run_objects(core, run_label) != []  # the run's ConfigMaps until close()
    _wait_gone(core, run_label)  # close() deleted the anchor; the collector did the rest
    run_streaming(log_url, Outputs(None, str(tmp_path / "ep")), allowed_lateness_s=5,
                  stop_when_idle_s=3)  # fmt: skip
    (episode,) = list(read_archive(tmp_path / "ep" / "episodes", Episode))
    assert episode.rollout_id == record.rollout_id and episode.reward == 1.0
    assert episode.samples and sum(episode.samples[0].loss_mask) > 0  # the generated tokens


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
    _wait_gone(core, run_label)


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
    _wait_gone(core, run_label)


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


def _copy_task(root: Path, cpus_line: str) -> Task:
    """echo-about under ``root``, with its ``cpus = 1`` line replaced by ``cpus_line``."""
    import shutil

    shutil.copytree(ECHO, root)
    toml = (root / "task.toml").read_text()
    assert "cpus = 1\n" in toml
    (root / "task.toml").write_text(toml.replace("cpus = 1\n", cpus_line + "\n"))
    return load_task(root)


DYING_RUN = """
import json, sys, time
from pathlib import Path
from infra.harnesses import NoOp
from infra.local.kwok_stages import AGENT_MESSAGE, VERIFIER_MESSAGE
from infra.tasks import load_task
from orchestrator.backend import RolloutJob
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
kubeconfig, task, root = sys.argv[1:4]
done = {AGENT_MESSAGE: '{"exit_code": 0}',
        VERIFIER_MESSAGE: '{"exit_code": 0, "file": "reward.txt"}\\n1'}
pod = PodSettings(namespace="NAMESPACE", harness_image="openforge:test", stray_ttl_s=1.0,
                  annotations=done)
backend = KubernetesBackend(KubeOptions(kubeconfig=Path(kubeconfig), pod=pod))
job = RolloutJob("dying-0", load_task(Path(task)), NoOp(), "k", "tiny", Path(root))
reward = backend.run(job, lambda end: None).reward.reward
print(reward, backend.labels["openforge.dev/run"], flush=True)
time.sleep(600)
""".replace("NAMESPACE", NS)


def test_a_run_that_died_without_cleaning_up_is_swept_by_the_next_one(
    local_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    import subprocess
    import sys

    dying = subprocess.Popen(
        [sys.executable, "-c", DYING_RUN, str(local_kube.kubeconfig), str(ECHO), str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    guard = threading.Timer(120, dying.kill)  # a hung rollout fails the test, not the suite
    guard.start()
    try:
        assert dying.stdout is not None
        line = dying.stdout.readline()
    finally:
        guard.cancel()
        dying.kill()  # SIGKILL: no close(), nothing deleted
        dying.wait()
    reward, label = line.split()
    assert float(reward) == 1.0
    left = _run_objects(core, label)
    assert sorted(o.split("/")[0] for o in left) == ["configmap"] * 2  # the anchor, the tests
    time.sleep(1.5)  # past its expiry
    pod = PodSettings(namespace=NS, harness_image="openforge:test")
    alive = KubernetesBackend(KubeOptions(kubeconfig=local_kube.kubeconfig, pod=pod))
    try:
        alive.prepare()  # deletes the expired anchor; the garbage collector takes the rest
        _wait_gone(core, label)
        assert _run_objects(core, alive.labels["openforge.dev/run"]) != []  # its own is kept
    finally:
        alive.close()
