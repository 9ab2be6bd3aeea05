"""The Kubernetes backend on the local cluster's real node, where every container really runs.

Under faults: the kubelet and the API server restarted mid-run, an agent OOM-killed, an image
the node cannot get. Each rollout ends (verified, or an infrastructure failure that says why)
within a minute of its fault, none is lost or rewarded twice, nothing is left in the namespace;
run through the command line, as a user types it. A rollout pod reaches the proxy and nothing
else (the NetworkPolicy, enforced). The built-in agent plays in a confined pod and its reward
becomes an episode. A run that died is swept by the next. (Oracle and noop on examples/images
in real pods, rewards from the verifier's container: the README's block, tests/readme.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from infra.local.kube import LocalKube

ROOT = Path(__file__).resolve().parents[2]
NS = "openforge-rollouts"
IMAGE = "localhost/python:3.11-slim"


@pytest.fixture(scope="module")
def core(real_kube: LocalKube) -> Any:
    from kubernetes import client

    api = client.CoreV1Api(real_kube.api())
    api.create_namespace({"metadata": {"name": NS}})
    return api


def _task(root: Path, name: str, solve: str, memory_mb: int = 256) -> Path:
    """A task of its own image whose solution runs ``solve`` then writes /app/done."""
    task = root / name
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True)
    (task / "instruction.md").write_text("Write /app/done.\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 60.0\n'
        f'[environment]\ncpus = 1\nmemory_mb = {memory_mb}\nstorage_mb = 256\nworkdir = "/app"\n'
    )
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nWORKDIR /app\nRUN chmod 1777 /app\n"
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\nset -e\n{solve}\necho ok > /app/done\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    return task


def _start(
    real_kube: LocalKube, tasks: Path, out: Path, *extra: str, sink: bool = True
) -> subprocess.Popen[str]:
    node = real_kube.real_node
    assert node is not None
    argv = [
        sys.executable, "-m", "openforge", "rollouts", "run", "--tasks", str(tasks),
        "--harness", "oracle", "--backend", "kubernetes", "--out", str(out), *extra,
        *(["--kube-image-sink", node.sink.url] if sink else []),
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(real_kube.kubeconfig)}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def _rewards(run: Path) -> dict[str, int]:
    from openforge.testing.proxy import read_events
    from schemas.reward import RewardEvent

    counts: dict[str, int] = {}
    for record in read_events(f"local:{run / 'services' / 'log'}", want=1):
        if isinstance(record, RewardEvent):
            counts[record.rollout_id] = counts.get(record.rollout_id, 0) + 1
    return counts


def test_a_kubelet_and_an_api_server_restarted_mid_run_lose_and_repeat_no_rollout(
    real_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    node = real_kube.real_node
    assert node is not None
    tasks = tmp_path / "tasks"
    _task(tasks, "sleepy", "sleep 8")
    out = tmp_path / "faults"
    run = _start(real_kube, tasks, out, "--n", "2", "--concurrency", "2")

    def running() -> bool:
        pods = core.list_namespaced_pod(NS).items
        return any(p.status.phase == "Running" for p in pods)

    deadline = time.monotonic() + 120
    while not running():
        assert run.poll() is None and time.monotonic() < deadline, "no pod ran"
        time.sleep(0.5)
    node.restart_kubelet(down_s=2.0)  # the pods run on without it
    real_kube.restart("kube-apiserver", down_s=2.0)  # the backend's watch resumes
    faulted = time.monotonic()
    stdout, _ = run.communicate(timeout=180)
    ended = time.monotonic() - faulted
    assert run.returncode == 0, stdout[-3000:]
    assert ended < 60, f"the run ended {ended:.0f} s after the faults"
    results = _results_all(out)
    assert len(results) == 2 and all(r["status"] == "verified" for r in results), results
    assert all(r["reward"] == 1.0 for r in results), results
    # each rollout rewarded exactly once, whatever its attempts were
    assert _rewards(out) == {r["rollout_id"]: 1 for r in results}
    assert core.list_namespaced_pod(NS).items == []


def test_an_oom_kill_and_a_missing_image_end_within_a_minute_and_say_why(
    real_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    # 400 MB in a 128 MiB container: the kernel kills the agent's process. Kubernetes then
    # never starts the verifier (an OOM-killed init container fails the pod, which stays
    # Pending): the attempt must end at once, not at the pod's deadline minutes later.
    greedy = tmp_path / "greedy"
    _task(greedy, "greedy", "python3 -c 'b = bytearray(400 << 20); print(len(b))'", memory_mb=128)
    # An image the node does not have and cannot pull (no sink: the pods name it as it is)
    missing = tmp_path / "missing"
    task = _task(missing, "missing", "true")
    toml = task / "task.toml"
    toml.write_text(toml.read_text() + 'docker_image = "localhost/openforge/never-built:1"\n')
    (task / "environment" / "Dockerfile").unlink()
    start = time.monotonic()
    runs = [
        _start(real_kube, greedy, tmp_path / "out-greedy", "--max-attempts", "1"),
        _start(real_kube, missing, tmp_path / "out-missing", "--max-attempts", "1", sink=False),
    ]
    outputs = [run.communicate(timeout=240)[0] for run in runs]
    took = time.monotonic() - start
    (oom,) = _results_all(tmp_path / "out-greedy")
    (never,) = _results_all(tmp_path / "out-missing")
    assert oom["status"] == "infra_failed" and "OOM-killed" in oom["message"], oom
    assert "memory_mb" in oom["message"], oom  # what to do next
    assert never["status"] == "infra_failed" and "image" in never["message"].lower(), never
    # neither was rewarded: no verifier ran
    assert _rewards(tmp_path / "out-greedy") == _rewards(tmp_path / "out-missing") == {}
    assert took < 90, f"{took:.0f} s"
    # A run where nothing succeeded does not exit 0.
    assert [run.returncode for run in runs] == [1, 1], outputs
    assert core.list_namespaced_pod(NS).items == []


def _results_all(run: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(run.glob("rollouts/*/result.json"))]


class _Server:
    """An HTTP server on this machine answering its own token."""

    def __init__(self, host: str) -> None:
        import http.server
        import threading

        token = uuid.uuid4().hex

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(token)))
                self.end_headers()
                self.wfile.write(token.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.token = token
        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


PROBE = """
import json, socket, sys, urllib.request
out = {}
for name, url in json.loads(sys.argv[1]).items():
    try:
        out[name] = urllib.request.urlopen(url, timeout=3).read().decode()
    except Exception as exc:
        out[name] = "refused" if "refused" in str(exc) else type(exc).__name__
print(json.dumps(out))
"""


def _probe(core: Any, ns: str, name: str, urls: dict[str, str], labels: dict[str, str],
           canary: str | None = None) -> dict[str, str]:  # fmt: skip
    """What a pod in ``ns`` reaches of ``urls`` (its output: each body, or why not)."""
    from orchestrator.kube_pod import _confined

    wait = f"{_confined(canary)} && " if canary else ""
    script = f"{wait}python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(urls))}"
    pod = {
        "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "command": ["bash", "-c", script]}]},
    }  # fmt: skip
    core.create_namespaced_pod(ns, pod)
    deadline = time.monotonic() + 90
    while core.read_namespaced_pod(name, ns).status.phase not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"pod {ns}/{name} did not end"
        time.sleep(0.3)
    log = core.read_namespaced_pod_log(name, ns)
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return dict(json.loads(log.strip().splitlines()[-1]))


def test_a_rollout_pod_reaches_the_proxy_and_nothing_else(real_kube: LocalKube, core: Any) -> None:
    """The backend's NetworkPolicy, enforced on the node by its policy agent: a rollout pod
    reaches the proxy's port and is refused everything else this machine serves (another port
    at the gateway, the kubelet, the cluster DNS, this machine's other address, another pod);
    the same probes from a namespace without the policy reach them all, so the refusals are the
    policy's."""
    from kubernetes import client

    from orchestrator.kube_objects import ROLE, network_policy

    node = real_kube.real_node
    assert node is not None
    node.load_image(IMAGE)
    proxy, other = _Server(node.gateway), _Server("0.0.0.0")
    machine = socket_address()
    core.create_namespace({"metadata": {"name": "open"}})
    peer = {
        "metadata": {"name": "peer", "labels": {"app": "peer"}},
        "spec": {"containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                                 "command": ["python3", "-m", "http.server", "8080"]}]},
    }  # fmt: skip
    core.create_namespaced_pod("open", peer)
    deadline = time.monotonic() + 60
    while not (ip := core.read_namespaced_pod("peer", "open").status.pod_ip):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    net = client.NetworkingV1Api(real_kube.api())
    with contextlib.suppress(client.ApiException):  # a run's policy: replaced by this one
        net.delete_namespaced_network_policy("openforge-rollouts", NS)
    net.create_namespaced_network_policy(
        NS, network_policy(NS, "openforge", {}, proxy.port, proxy_cidr=f"{node.gateway}/32")
    )
    urls = {
        "proxy": f"http://{node.gateway}:{proxy.port}/",
        "other port": f"http://{node.gateway}:{other.port}/",
        "machine": f"http://{machine}:{other.port}/",
        "kubelet": f"http://{node.gateway}:{node.port}/",
        "cluster DNS": f"http://{node.gateway}:53/",  # CoreDNS's TCP port
        "peer pod": f"http://{ip}:8080/",
    }
    time.sleep(1.0)  # the peer's server
    free = _probe(core, "open", "free", urls, {})
    assert free["proxy"] == proxy.token and free["other port"] == other.token
    assert free["machine"] == other.token and "refused" not in free["peer pod"]
    assert free["kubelet"] != "refused"  # it answers (a TLS port spoken to in plain HTTP)
    assert free["cluster DNS"] != "refused"  # (a DNS port spoken to in HTTP)
    confined = _probe(core, NS, "confined", urls, {ROLE: "rollout"}, canary=node.policy.canary)
    assert confined == {"proxy": proxy.token, "other port": "refused", "machine": "refused",
                        "kubelet": "refused", "cluster DNS": "refused",
                        "peer pod": "refused"}, confined  # fmt: skip
    core.delete_namespaced_pod("peer", "open", grace_period_seconds=0)


def socket_address() -> str:
    """This machine's address on its own network (not loopback, not a pod network's)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return str(s.getsockname()[0])


ECHO = ROOT / "examples" / "echo-words" / "echo-about"


def _container(pod: Any, name: str) -> Any:
    return next(c for c in [*pod.spec.init_containers, *pod.spec.containers] if c.name == name)


def _check_confined(pod: Any, proxy_port: int, gateway: str, net: Any) -> None:
    """No token, no service links, a deadline, non-root everywhere, the task's resources, the
    tests only in the verifier, the rollout's Secret only in the agent, the harness in the
    task's built image (no copy of it per pod), egress to the proxy's address and port only."""
    from orchestrator.kube_objects import ROLE

    spec = pod.spec
    assert spec.automount_service_account_token is False
    assert spec.enable_service_links is False and spec.restart_policy == "Never"
    assert spec.active_deadline_seconds == 60 + 30 + 300
    assert spec.security_context.run_as_non_root is True
    containers = [*spec.init_containers, *spec.containers]
    assert [c.name for c in containers] == ["workspace", "agent", "verifier"]
    for c in containers:
        sc = c.security_context
        assert sc.run_as_non_root and sc.allow_privilege_escalation is False
        assert sc.read_only_root_filesystem and sc.capabilities.drop == ["ALL"]
        # task.toml: cpus = 1, memory_mb = 1024, storage_mb = 64 (as the API server writes them)
        assert c.resources.limits == {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "64Mi"}
        # kubernetes cpu_request = 0.5: half the task's cpu requested, its limit the task's
        assert c.resources.requests == {**c.resources.limits, "cpu": "500m"}
        assert c.image.startswith("localhost/openforge/with-agent:")
    mounts = {c.name: {m.name for m in c.volume_mounts} for c in containers}
    assert [n for n, m in mounts.items() if "tests" in m or "tests-files" in m] == ["verifier"]
    assert [n for n, m in mounts.items() if "rollout" in m] == ["agent"]
    secret_users = {
        c.name
        for c in containers
        for e in (c.env or [])
        if e.value_from and e.value_from.secret_key_ref
    }
    assert secret_users == {"agent"}
    policy = net.read_namespaced_network_policy("openforge-rollouts", NS)
    assert policy.spec.pod_selector.match_labels == {ROLE: "rollout"}
    assert not policy.spec.ingress
    proxy_rule = policy.spec.egress[0]
    assert [p.port for p in proxy_rule.ports] == [proxy_port]
    assert [t.ip_block.cidr for t in proxy_rule.to] == [f"{gateway}/32"]


def test_the_agent_plays_in_a_confined_pod_and_its_reward_becomes_an_episode(
    real_kube: LocalKube, core: Any, vllm_server: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The built-in agent runs in its pod on the node, in the task's image built with the
    agent's Python added, and calls vLLM through the proxy (listening on the node's gateway);
    its reward is what the verifier's container wrote, and the Beam pipeline makes the
    recorded calls and that reward one episode whose generated tokens are in the loss."""
    import threading
    from urllib.parse import urlsplit

    from kubernetes import client

    from infra.harnesses import harness
    from infra.tasks import load_task
    from openforge.testing.proxy import proxy_config, running_proxy
    from orchestrator.kube_pod import PodSettings
    from orchestrator.kubernetes import KubeOptions, KubernetesBackend
    from orchestrator.plan import plan
    from orchestrator.run import Orchestrator, OrchestratorConfig
    from orchestrator.rundir import RunDir, Status
    from pipeline.jobs import Outputs, run_streaming
    from schemas.archive import read_archive
    from schemas.episode import Episode

    node = real_kube.real_node
    assert node is not None
    config = proxy_config(vllm_server.base_url, tmp_path / "proxy", tokenizer=tiny_model_dir)
    with running_proxy(config, host=node.gateway) as proxy:
        port = urlsplit(proxy.url).port
        assert port is not None
        pod = PodSettings(namespace=NS, proxy_url=proxy.url, egress_canary=node.policy.canary,
                          cpu_request=0.5)  # fmt: skip
        backend = KubernetesBackend(KubeOptions(
            kubeconfig=real_kube.kubeconfig, pod=pod, proxy_port=port,
            proxy_cidr=f"{node.gateway}/32", image_sink=node.sink.url,
        ))  # fmt: skip
        orch = Orchestrator(backend, harness("agent"), proxy.admin, RunDir(tmp_path / "run"),
                            OrchestratorConfig(concurrency=1, max_attempts=1))  # fmt: skip
        try:
            orch.check([load_task(ECHO)])
            records: list[Any] = []
            runner = threading.Thread(
                target=lambda: records.extend(orch.run(plan([load_task(ECHO)], 1, backend.run_id)))
            )
            runner.start()
            deadline = time.monotonic() + 120
            while not (pods := core.list_namespaced_pod(NS, label_selector=backend.selector).items):
                assert time.monotonic() < deadline, "no rollout pod"
                time.sleep(0.2)
            _check_confined(pods[0], port, node.gateway, client.NetworkingV1Api(real_kube.api()))
            runner.join(180)
            assert not runner.is_alive()
        finally:
            backend.close()
        (record,) = records
        assert record.status is Status.VERIFIED and record.calls >= 1, record
        out = tmp_path / "run" / "rollouts" / record.rollout_id / "agent.out"
        kinds = [json.loads(line)["type"] for line in out.read_text().splitlines()]
        assert kinds[0] == "start" and kinds[-1] == "final"  # the agent's output, from its pod
        saved = json.loads((out.parent / "final-workspace.json").read_text())
        assert saved["saved"] is True and saved["workdir"] == "/app", saved  # kept for rescore
        proxy.flush()
        log_url = proxy.config.log_url
    run_streaming(log_url, Outputs(None, str(tmp_path / "ep")), allowed_lateness_s=5,
                  stop_when_idle_s=3)  # fmt: skip
    (episode,) = list(read_archive(tmp_path / "ep" / "episodes", Episode))
    assert episode.rollout_id == record.rollout_id and episode.reward == record.reward
    assert episode.samples and sum(episode.samples[0].loss_mask) > 0  # the generated tokens
    assert core.list_namespaced_pod(NS, label_selector=backend.selector).items == []


DYING_RUN = """
import sys, time
from pathlib import Path
from infra.harnesses import NoOp
from infra.tasks import load_task
from orchestrator.backend import RolloutJob
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
kubeconfig, task, root, sink = sys.argv[1:5]
pod = PodSettings(namespace="NAMESPACE", stray_ttl_s=1.0)
options = KubeOptions(kubeconfig=Path(kubeconfig), pod=pod, image_sink=sink)
backend = KubernetesBackend(options)
job = RolloutJob("dying-0", load_task(Path(task)), NoOp(), "k", "tiny", Path(root))
backend.check(job.task, job.harness)
reward = backend.run(job, lambda end: None).reward.reward
print(reward, backend.labels["openforge.dev/run"], flush=True)
time.sleep(600)
""".replace("NAMESPACE", NS)


def test_a_run_that_died_without_cleaning_up_is_swept_by_the_next_one(
    real_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    """A run killed after its pod ended leaves its anchor, its task's ConfigMaps and the
    rollout's Pod and Secret; once they expire, the next run in the namespace deletes the
    anchor and the garbage collector the rest, while the new run's own objects stay."""
    from orchestrator.kube_pod import PodSettings
    from orchestrator.kubernetes import KubeOptions, KubernetesBackend
    from tests.orchestrator.conftest import run_objects, wait_gone

    node = real_kube.real_node
    assert node is not None
    argv = [sys.executable, "-c", DYING_RUN, str(real_kube.kubeconfig), str(ECHO), str(tmp_path),
            node.sink.url]  # fmt: skip
    dying = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    guard = threading.Timer(180, dying.kill)  # a hung rollout fails the test, not the suite
    guard.start()
    try:
        assert dying.stdout is not None
        line = dying.stdout.readline()
    finally:
        guard.cancel()
        dying.kill()  # SIGKILL: no close(), nothing deleted
        dying.wait()
    reward, label = line.split()
    assert float(reward) == 0.0  # the verifier's, in the pod: noop wrote no answer
    left = run_objects(core, NS, label)
    # the anchor, the tests; and the verified rollout's pod and secret, whose batched delete
    # (kube_reaper, 2 s after) never came
    assert sorted(o.split("/")[0] for o in left) == ["configmap", "configmap", "pod", "secret"]
    time.sleep(1.5)  # past its expiry
    alive = KubernetesBackend(
        KubeOptions(kubeconfig=real_kube.kubeconfig, pod=PodSettings(namespace=NS))
    )
    try:
        alive.prepare()  # deletes the expired anchor; the garbage collector takes the rest
        wait_gone(core, NS, label)
        assert run_objects(core, NS, alive.labels["openforge.dev/run"]) != []  # its own is kept
    finally:
        alive.close()


ADVERSARY = r"""
set -u
http() {  # METHOD PATH [BODY]: the proxy's answer (status line first)
  exec 3<>"/dev/tcp/$PROXY_HOST/$PROXY_PORT" || return 1
  local head='%s %s HTTP/1.0\r\nHost: proxy\r\nAuthorization: Bearer %s\r\n'
  head+='Content-Type: application/json\r\nContent-Length: %s\r\n\r\n%s'
  # shellcheck disable=SC2059
  printf "$head" "$1" "$2" "$OPENFORGE_API_KEY" "${#3}" "$3" >&3
  cat <&3
  exec 3<&-
}
status() { http "$@" | head -1 | cut -d' ' -f2; }
{
  echo '{'
  echo "\"health\": $(http GET /health '' | grep -c '"status":"ok"'),"
  for target in $TARGETS; do
    if timeout 3 bash -c "exec 3<>/dev/tcp/${target%:*}/${target#*:}" 2>/dev/null; then
      r=open; else r=closed; fi
    echo "\"$target\": \"$r\","
  done
  for f in /tests /openforge/tests /logs/verifier /solution \
           /var/run/secrets/kubernetes.io/serviceaccount; do
    if [ -e "$f" ]; then r=present; else r=absent; fi
    echo "\"$f\": \"$r\","
  done
  echo "\"rollout_secret_files\": \"$(ls /openforge/rollout | tr '\n' ' ')\","
  echo "\"env\": \"$(env | cut -d= -f1 | sort | tr '\n' ' ')\","
  r=$(status POST "/rollout/$ROLLOUT_ID/reward" '{"reward": 1.0}')
  echo "\"reward_with_rollout_key\": \"$r\","
  echo "\"register_with_rollout_key\": \"$(status POST /admin/rollouts '{"rollout_id": "mine"}')\","
  if echo 1 > /logs/verifier/reward.txt 2>/dev/null; then r=written; else r=refused; fi
  echo "\"verifier_reward_file\": \"$r\""
  echo '}'
} > "$HOME/probe.json"
tr -d '\n' < "$HOME/probe.json"; echo
(exec -a openforge-probe-sleeper sleep 1000) &
setsid bash -c 'exec -a openforge-probe-sleeper sleep 1000' &
echo probed
"""


def test_an_adversarial_agent_gets_nothing_from_its_pod(
    real_kube: LocalKube, core: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An agent that probes for everything gets nothing on this backend, as on the local one:
    the proxy answers; the kubelet, the API server, another port of this machine and its
    other address are refused; the tests, the verifier's files, the solution and a service
    account token are not there; its Secret holds its home alone and its environment no
    credential but its rollout key, which can neither post a reward nor register a rollout;
    the daemons it leaves die with the pod; and the reward recorded is the verifier's."""
    from urllib.parse import urlsplit

    from infra.tasks import load_task
    from openforge.testing.proxy import proxy_config, read_events, running_proxy
    from orchestrator.kube_pod import PodSettings
    from orchestrator.kubernetes import KubeOptions, KubernetesBackend
    from orchestrator.plan import plan
    from orchestrator.run import Orchestrator, OrchestratorConfig
    from orchestrator.rundir import RunDir, Status
    from schemas.reward import RewardEvent
    from tests.orchestrator.conftest import ScriptHarness

    node = real_kube.real_node
    assert node is not None
    root = tmp_path / "adversarial"
    for d in ("environment", "tests"):
        (root / d).mkdir(parents=True)
    (root / "instruction.md").write_text("Take what you can.\n")
    (root / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n'
        '[environment]\ncpus = 1\nmemory_mb = 256\nstorage_mb = 64\nworkdir = "/app"\n'
    )
    (root / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        """echo '{"reward": 0.25, "probe_ran": 1}' > /logs/verifier/reward.json\n"""
    )
    other = _Server("0.0.0.0")  # another service of this machine
    config = proxy_config("http://127.0.0.1:9", tmp_path / "proxy", tokenizer=tiny_model_dir,
                          max_model_len=4096, upstream_model="tiny")  # fmt: skip
    with running_proxy(config, host=node.gateway) as proxy:
        port = urlsplit(proxy.url).port
        assert port is not None
        adversary = ScriptHarness(ADVERSARY, {
            "PROXY_HOST": node.gateway, "PROXY_PORT": str(port),
            "TARGETS": " ".join([
                f"{node.gateway}:{node.port}", f"{node.gateway}:{real_kube.api_port}",
                f"{node.gateway}:{other.port}", f"{socket_address()}:{other.port}",
            ]),
        })  # fmt: skip
        pod = PodSettings(namespace=NS, proxy_url=proxy.url, egress_canary=node.policy.canary)
        backend = KubernetesBackend(KubeOptions(
            kubeconfig=real_kube.kubeconfig, pod=pod, proxy_port=port,
            proxy_cidr=f"{node.gateway}/32", image_sink=node.sink.url,
        ))  # fmt: skip
        orch = Orchestrator(backend, adversary, proxy.admin, RunDir(tmp_path / "run"),
                            OrchestratorConfig(concurrency=1, max_attempts=1))  # fmt: skip
        try:
            task = load_task(root)
            orch.check([task])
            (record,) = orch.run(plan([task], 1, backend.run_id))
        finally:
            backend.close()
        proxy.flush()
        events = read_events(proxy.config.log_url, want=2)
    assert record.status is Status.VERIFIED and record.agent_phase == "finished", record
    log = (tmp_path / "run" / "rollouts" / record.rollout_id / "agent.out").read_text()
    found = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    assert found["health"] == 1  # the proxy answers
    for target in adversary.extra["TARGETS"].split():
        assert found[target] == "closed", (target, found)
    for path in ("/tests", "/openforge/tests", "/logs/verifier", "/solution",
                 "/var/run/secrets/kubernetes.io/serviceaccount"):  # fmt: skip
        assert found[path] == "absent", (path, found)
    assert found["rollout_secret_files"].split() == ["home.tar.gz"]
    names = set(found["env"].split())
    assert not {n for n in names if re.search("TOKEN|SECRET|PASSWORD|KEY", n)} - {
        "OPENFORGE_API_KEY"
    }, names
    assert found["reward_with_rollout_key"] == "401"
    assert found["register_with_rollout_key"] == "401"
    assert found["verifier_reward_file"] == "refused"
    sleepers = subprocess.run(["pgrep", "-f", "openforge-probe-sleeper"], capture_output=True)
    assert sleepers.stdout.split() == []  # the daemons died with the pod
    (reward,) = [e for e in events if isinstance(e, RewardEvent)]
    assert reward.rollout_id == record.rollout_id and reward.reward == 0.25
    assert reward.components == {"reward": 0.25, "probe_ran": 1.0}
    assert core.list_namespaced_pod(NS, label_selector=backend.selector).items == []
