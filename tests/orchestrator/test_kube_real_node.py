"""The Kubernetes backend on the local cluster's real node: each task's own image (its whole
Dockerfile: ``RUN apt-get``, ``USER``, stages) built here and published to the node's containerd;
one pod per rollout whose containers really run; the reward read from what the verifier's
container wrote; the logs kept in the run directory; nothing left in the namespace. Run through
the command line, as a user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.local.kube import LocalKube

ROOT = Path(__file__).resolve().parents[2]
NS = "openforge-rollouts"


@pytest.fixture(scope="module")
def core(real_kube: LocalKube) -> Any:
    from kubernetes import client

    api = client.CoreV1Api(real_kube.api())
    api.create_namespace({"metadata": {"name": NS}})
    return api


def _results(run: Path) -> dict[str, dict[str, Any]]:
    return {
        (r := json.loads(p.read_text()))["task_id"]: r for p in run.glob("rollouts/*/result.json")
    }


def test_oracle_and_noop_run_in_pods_of_each_tasks_built_image(
    real_kube: LocalKube, core: Any, tmp_path: Path
) -> None:
    node = real_kube.real_node
    assert node is not None
    out = tmp_path / "kube"
    argv = [
        sys.executable, "-m", "openforge", "rollouts", "run", "--tasks", "examples/images",
        "--harness", "oracle,noop", "--backend", "kubernetes",
        "--kube-image-sink", node.sink.url, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(real_kube.kubeconfig)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(built, published to containerd://" in " ".join(done.stdout.split())
    oracle, noop = _results(out / "oracle"), _results(out / "noop")
    tasks = {"sqlite-report", "run-as-user", "package-count"}
    assert set(oracle) == set(noop) == tasks
    # The same verifier, run in the pod after each harness: 1 for the solution, 0 for nothing.
    assert {t: (r["status"], r["reward"]) for t, r in oracle.items()} == {
        t: ("verified", 1.0) for t in tasks
    }
    assert {t: (r["status"], r["reward"]) for t, r in noop.items()} == {
        t: ("verified", 0.0) for t in tasks
    }
    # What the containers printed, kept before the pods were deleted. sqlite-report's image
    # has sqlite3 and jq from its `RUN apt-get install`: its solution's output is their work.
    sqlite = next((out / "oracle" / "rollouts").glob("*sqlite-report*"))
    assert json.loads((sqlite / "agent.out").read_text())["grace"] == 104000
    assert "reward: 1" in (sqlite / "verifier.out").read_text()
    for run in (out / "oracle", out / "noop"):
        assert all((d / "verifier.out").exists() for d in (run / "rollouts").iterdir())
    # Every built image is on the node; no rollout's pod or secret is left.
    assert sum(ref.startswith("localhost/openforge/task:") for ref in node.images()) >= 3
    assert core.list_namespaced_pod(NS).items == []
    assert [s for s in core.list_namespaced_secret(NS).items if s.type == "Opaque"] == []
