"""`openforge train` end to end on a 2-update config: every real part runs.

vLLM (LoRA hot-loads), the capture proxy, the embedded event log, the streaming Beam pipeline,
the orchestrator with the built-in agent harness in bubblewrap sandboxes, the CPU trainer, and
held-out evaluations. No reward increase is asserted here: that is bench/train_demo.py's job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from infra.eventlog import EPISODES_TOPIC, EVENTS_TOPIC, open_reader
from infra.local.kafka import KafkaBroker
from schemas.codec import decode_message
from schemas.completion import CompletionEvent

ROOT = Path(__file__).resolve().parents[3]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


def _train(out: Path, extra: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    overrides = [
        "warm_start.recipe=none",  # the raw tiny model: this test checks the wiring
        "trainer.steps=2",
        "tasks.per_step=2",
        "rollouts.samples_per_task=2",
        "rollouts.concurrency=2",
        "evaluation.every=2",
        "evaluation.samples_per_task=1",
        f"run.output_dir={out}",
        *extra,
    ]
    argv = [sys.executable, "-m", "openforge", "train", str(ROOT / "examples" / "cpu-demo.toml")]
    for o in overrides:
        argv += ["--set", o]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return argv, done


def _check_run(out: Path, log_url: str) -> None:
    """What every short run must leave behind, whatever its event log."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["policy_version"] == 2
    # Held-out evaluations at the initial and the final policy, recorded.
    assert sorted(int(v) for v in summary["heldout"]) == [0, 2]
    assert (out / "curves.png").stat().st_size > 0
    assert (out / "trainer" / "metrics.csv").exists()
    assert any((out / "trainer" / "tensorboard").iterdir())
    assert (out / "trainer" / "checkpoints" / "LATEST").exists()
    assert list((out / "episodes").rglob("*.parquet"))  # the pipeline's Parquet archive

    with open_reader(log_url, [EVENTS_TOPIC, EPISODES_TOPIC], "check") as reader:
        records = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    completions = [e for e in records if isinstance(e, CompletionEvent)]
    stamped = {s.version for c in completions for s in c.policy_versions}
    assert {0, 1} <= stamped, stamped  # update 1 trained on v0 rollouts, update 2 on v1
    heldout = {
        "echo-" + w for w in ("read", "long", "come", "made", "look", "two", "other", "about")
    }
    consumed = [
        json.loads(line) for line in (out / "trainer" / "consumed.jsonl").read_text().splitlines()
    ]
    trained = {e for row in consumed for e in row["episodes"]}
    assert len(trained) == 2 * 2 * 2  # two updates of 2 tasks x 2 samples
    episodes = {e.episode_id: e for e in records if type(e).__name__ == "Episode"}
    assert all(episodes[e].task_id not in heldout for e in trained)  # never trained on held-out
    assert any(e.task_id in heldout for e in episodes.values())  # but they are recorded
    played = {p.parent.name for p in out.glob("*/rollouts/*/result.json")}
    assert played and played <= {e.rollout_id for e in episodes.values()}  # none left behind

    assert _processes_mentioning(str(out)) == []  # vLLM, the proxy, the pipeline: all stopped


def test_a_short_training_run_goes_through_every_part(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv, done = _train(out, [])
    assert "2 updates in" in done.stdout
    _check_run(out, f"local:{out / 'log'}")

    # Rerunning the finished run resumes from its checkpoint and has nothing left to do.
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming after update 2" in again.stdout
    assert json.loads((out / "summary.json").read_text())["updates"] == 2
    assert _processes_mentioning(str(out)) == []


def test_the_same_config_runs_on_kafka(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # A broker of its own: the run's topics and consumer groups see only this run.
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}"
        _train(out, [f"event_log.url={url}"])
        _check_run(out, url)
    assert not (out / "log").exists()  # nothing went to the embedded log
