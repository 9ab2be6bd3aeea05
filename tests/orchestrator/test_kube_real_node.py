"""The Kubernetes backend on the local cluster's real node, under faults: the kubelet and the
API server restarted mid-run, an agent OOM-killed, an image the node cannot get. Each rollout
ends (verified, or an infrastructure failure that says why) within a minute of its fault, none
is lost or rewarded twice, nothing is left in the namespace. Run through the command line, as a
user types it. (Oracle and noop on examples/images in real pods, rewards from the verifier's
container: the README's block, tests/readme.)"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
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
    at the gateway, the kubelet, this machine's other address, another pod); the same probes
    from a namespace without the policy reach them all, so the refusals are the policy's."""
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
        "peer pod": f"http://{ip}:8080/",
    }
    time.sleep(1.0)  # the peer's server
    free = _probe(core, "open", "free", urls, {})
    assert free["proxy"] == proxy.token and free["other port"] == other.token
    assert free["machine"] == other.token and "refused" not in free["peer pod"]
    assert free["kubelet"] != "refused"  # it answers (a TLS port spoken to in plain HTTP)
    confined = _probe(core, NS, "confined", urls, {ROLE: "rollout"}, canary=node.policy.canary)
    assert confined == {"proxy": proxy.token, "other port": "refused", "machine": "refused",
                        "kubelet": "refused", "peer pod": "refused"}, confined  # fmt: skip
    core.delete_namespaced_pod("peer", "open", grace_period_seconds=0)


def socket_address() -> str:
    """This machine's address on its own network (not loopback, not a pod network's)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return str(s.getsockname()[0])
