"""The live-traffic manifests (``infra/k8s/serve``), rendered by kustomize and applied with
``kubectl apply -k`` to the local control plane with a real kubelet node: vLLM, the proxy, two
pipeline workers and the trainer run as the pods the manifests describe (their commands, probes,
security contexts, Services and secrets; :mod:`openforge.testing.kube_serve` says what the
overlay changes for this machine), on this machine's Kafka with four partitions. Simulated users
play sessions through the proxy's Service and post feedback; the trainer trains on the episodes
the pipeline assembled and the proxy serves the new policy."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra.local.kafka import KafkaBroker
from infra.local.kube import LocalKube
from openforge.query.lineage import consumed
from openforge.testing.kube_serve import (
    NAMESPACE,
    HostInstall,
    LocalSettings,
    runtime_image,
    write_overlay,
)

pytestmark = pytest.mark.timeout(900)
WORKLOADS = [
    "deployment/openforge-vllm", "deployment/openforge-proxy",
    "statefulset/openforge-pipeline", "statefulset/openforge-trainer",
]  # fmt: skip


def _kubectl(kube: LocalKube, *args: str, timeout: float = 120, check: bool = True) -> str:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    done = subprocess.run(
        ["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0 or not check, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout + ("" if check else done.stderr)


def _logs(kube: LocalKube, pod: str, tail: int = 40) -> str:
    """``kubectl logs`` of ``pod`` (the API server asks the node's kubelet)."""
    return _kubectl(kube, "-n", NAMESPACE, "logs", pod, f"--tail={tail}")


def _restarted(kube: LocalKube, pod: dict[str, Any]) -> str:
    """Why a pod's container restarted: its last state and what the exited run printed."""
    name = pod["metadata"]["name"]
    status = pod["status"]["containerStatuses"][0]
    previous = _kubectl(kube, "-n", NAMESPACE, "logs", name, "--previous", "--tail=60", check=False)
    return f"{name}: {status.get('lastState')}\n{previous}"


def _serving(kube: LocalKube, timeout: float) -> None:
    """Wait for the trainer to serve its starting weights (vLLM then has ``policy``)."""
    deadline = time.monotonic() + timeout
    while "serving the starting weights" not in (log := _logs(kube, "openforge-trainer-0", 200)):
        assert time.monotonic() < deadline, f"the trainer serves nothing:\n{log}"
        time.sleep(2)


def _pods(kube: LocalKube) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = json.loads(
        _kubectl(kube, "-n", NAMESPACE, "get", "pods", "-o", "json")
    )["items"]
    return pods


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _wait_ready(kube: LocalKube, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        pods = _pods(kube)
        ready = [p for p in pods if _ready(p)]
        if len(pods) == 5 and len(ready) == 5:
            return pods
        if time.monotonic() > deadline:
            logs = "\n".join(_logs(kube, p["metadata"]["name"]) for p in pods if p not in ready)
            raise AssertionError(
                f"pods not ready: {[p['metadata']['name'] for p in pods if p not in ready]}\n{logs}"
            )
        time.sleep(2)


def _model(tiny_model_dir: Path, data: Path) -> None:
    """The served model where the models volume has it (readable by the pods' user)."""
    base = data / "models" / "base"
    shutil.copytree(tiny_model_dir, base)
    for path in [data / "models", *base.rglob("*"), base]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _users(kube: LocalKube, tmp_path: Path, until_version: int) -> dict[str, int]:
    """``openforge traffic`` through the proxy's Service (its cluster IP: this machine has no
    cluster DNS, its pods have) until the proxy stamps ``until_version``: sessions in the three
    dialects, every one with feedback."""
    ip = _kubectl(kube, "-n", NAMESPACE, "get", "service", "openforge-proxy",
                  "-o", "jsonpath={.spec.clusterIP}")  # fmt: skip
    users = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "openforge"), "traffic",
         "--proxy", f"http://{ip}:8000", "--until-version", str(until_version),
         "--sessions", "60", "--users", "2", "--turns", "2", "--feedback-fraction", "1",
         "--feedback-delay", "1", "--max-tokens", "8", "--feedback-token-file", "feedback-token"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert users.returncode == 0, f"{users.stdout}\n{users.stderr}"
    counts: dict[str, int] = json.loads(users.stdout.strip().splitlines()[-1])
    why = (
        f"{counts}\n{users.stderr}\nproxy:\n{_logs(kube, 'deployment/openforge-proxy', 60)}"
        f"\ntrainer:\n{_logs(kube, 'openforge-trainer-0', 60)}"
    )
    assert counts["calls_failed"] == 0 and counts["feedback_failed"] == 0, why
    return counts


def _reach(kube: LocalKube, pod: str, url: str) -> str:
    """What a call from ``pod`` to ``url`` got: an HTTP status, or the error's name."""
    code = (
        "import sys, urllib.request\n"
        "try: print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
        "except Exception as e: print(type(getattr(e, 'reason', e)).__name__)"
    )
    return _kubectl(kube, "-n", NAMESPACE, "exec", pod, "--", "python3", "-c", code, url).strip()


def _trained(data: Path) -> list[str]:
    steps = consumed(data / "runs" / "trainer" / "consumed.jsonl")
    return [e for ids in steps.values() for e in ids]


def test_the_serve_manifests_run_on_a_real_node_and_the_served_policy_advances(
    real_kube: LocalKube, tiny_model_dir: Path, tmp_path: Path
) -> None:
    node = real_kube.real_node
    assert node is not None
    image = runtime_image(HostInstall.here())
    node.load_image(image)
    with KafkaBroker(host=node.gateway) as broker:
        data = tmp_path / "data"
        _model(tiny_model_dir, data)
        settings = LocalSettings(
            kafka_url=f"{broker.url}?partitions=4", data=data, image=image,
            admin_token=secrets.token_urlsafe(24), feedback_token=secrets.token_urlsafe(24),
        )  # fmt: skip
        overlay = write_overlay(tmp_path / "overlay", settings)
        applied = _kubectl(real_kube, "apply", "-k", str(overlay))
        for workload in WORKLOADS:
            assert f"{workload.replace('/', '.apps/')} created" in applied, applied
        pods = _wait_ready(real_kube, 420)
        assert {p["metadata"]["name"] for p in pods} >= {
            "openforge-pipeline-0",
            "openforge-pipeline-1",
            "openforge-trainer-0",
        }
        _serving(real_kube, 300)
        (tmp_path / "feedback-token").write_text(settings.feedback_token + "\n")
        first = _users(real_kube, tmp_path, until_version=1)
        assert first["policy_version"] >= 1 and first["calls_answered"] >= 2, first
        # The trainer (its pod) wrote its updates to the runs volume; each episode once.
        trained = _trained(data)
        assert len(trained) == len(set(trained)) >= settings.groups_per_batch, trained
        assert list((data / "runs" / "archive").rglob("*.parquet")), "the pipeline archived nothing"
        # The manifests' NetworkPolicy holds: vLLM answers the trainer, not the pipeline.
        vllm = "http://openforge-vllm.openforge.svc.cluster.local:8000/health"
        assert _reach(real_kube, "openforge-trainer-0", vllm) == "200"
        assert _reach(real_kube, "openforge-pipeline-0", vllm) == "ConnectionRefusedError"
        # Every pod ran as the manifests say, and none restarted.
        for pod in _pods(real_kube):
            restarts = pod["status"]["containerStatuses"][0]["restartCount"]
            assert restarts == 0, _restarted(real_kube, pod)
            assert pod["spec"]["securityContext"]["runAsUser"] == 10001
        # The trainer's pod replaced: the StatefulSet's new pod resumes from the runs volume and
        # the consumer group's offsets, serves a new version, and trains nothing twice.
        _kubectl(real_kube, "-n", NAMESPACE, "delete", "pod", "openforge-trainer-0")
        _wait_ready(real_kube, 300)
        _serving(real_kube, 300)
        second = _users(real_kube, tmp_path, until_version=first["policy_version"] + 2)
        again = _trained(data)
        assert len(again) == len(set(again)) > len(trained), again
        assert second["policy_version"] >= first["policy_version"] + 2, second
        _kubectl(real_kube, "delete", "-k", str(overlay), "--wait=false")
