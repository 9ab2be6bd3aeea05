"""`openforge train` scaled out: the 2-update config with a Kafka broker of its own as the event
log and every rollout a pod on the local Kubernetes cluster's real node.

The same config on the embedded log and sandboxes is the README's main job, checked in depth by
tests/readme (with tests/openforge/train/checks.py); this one swaps the event log for a real
broker and the rollout backend for Kubernetes (the run starts its own cluster: a control plane
and a kubelet on containerd and runc, kube-router enforcing the rollout NetworkPolicy) and runs
the same checks. The raw tiny model (no warm start): this checks the wiring. Its held-out
evaluations cover the split's first two tasks (``evaluation.tasks``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from infra.local.kafka import KafkaBroker
from infra.tasks import load_dataset
from tests.openforge.train.checks import check_run

ROOT = Path(__file__).resolve().parents[3]


def _train(out: Path, extra: list[str]) -> None:
    overrides = [
        "warm_start.recipe=none",  # the raw tiny model: this test checks the wiring
        "trainer.steps=2",
        "tasks.per_step=2",
        "rollouts.samples_per_task=2",
        "rollouts.concurrency=4",
        "evaluation.every=2",
        "evaluation.samples_per_task=1",
        "evaluation.tasks=2",  # the held-out split's first two tasks
        f"run.output_dir={out}",
        *extra,
    ]
    argv = [sys.executable, "-m", "openforge", "train", str(ROOT / "examples" / "cpu-demo.toml")]
    for o in overrides:
        argv += ["--set", o]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 updates in" in done.stdout


def _ran_in_pods(out: Path) -> None:
    """Every rollout, trained on or evaluated, was a pod of the real node's kubelet (its log,
    kept under the run's services/), its agent's output came back from the container's log, and
    that agent called the model from there through the proxy (its recorded calls)."""
    kubelet = (out / "services" / "kube" / "node-0" / "logs" / "kubelet.log").read_text()
    pods = set(re.findall(r"\bro-([a-z0-9-]+)-[0-9a-f]{10}\b", kubelet))
    results = {p.parent: json.loads(p.read_text()) for p in out.glob("*/rollouts/*/result.json")}
    assert len(results) == 2 * 4 + 2 * 2  # two updates of 4, two evaluations of 2
    assert {r["rollout_id"] for r in results.values()} <= pods
    assert all(r["status"] == "verified" and r["calls"] >= 1 for r in results.values()), results
    for where in results:  # what the agent printed in its container: its start and its end
        kinds = [
            json.loads(line)["type"] for line in (where / "agent.out").read_text().splitlines()
        ]
        assert kinds[0] == "start" and kinds[-1] == "final", kinds


def test_the_same_config_runs_on_kafka_with_pods_on_kubernetes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # A broker of its own: the run's topics and consumer groups see only this run.
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}"
        # Pods request a quarter of their task's cpu (limit 1), so the 2-core node runs all 4
        # rollouts of an update at once.
        _train(out, [f"event_log.url={url}", "rollouts.backend=kubernetes",
                     "kubernetes.cpu_request=0.25"])  # fmt: skip
        check_run(out, url, per_update=4)
    _ran_in_pods(out)
    evaluated = [json.loads(p.read_text()) for p in out.glob("eval/rollouts/*/result.json")]
    assert len(evaluated) == 2 * 2  # two tasks, once each at v0 and at v2
    heldout = load_dataset(ROOT / "examples" / "echo-words", split="heldout")
    assert {r["task_id"] for r in evaluated} == {t.id for t in heldout[:2]}
    assert not (out / "log").exists()  # nothing went to the embedded log
