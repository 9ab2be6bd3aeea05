"""`openforge train examples/cpu-demo-recovery.toml` (issue 53, item 4), as a user types it,
shortened to 1 update: half the training rollouts drawn a sandbox fault (the first command bash
runs fails once), the held-out split evaluated clean and again with the fault in every rollout
(``eval.csv`` and ``eval-faulted.csv``, both in the summary and the last line). The main job's
checks hold (``checks.check_run``: the faulted evaluation's rollouts are held out too, never
trained on). Every faulted held-out rollout recorded its draw, and what fired, with its events."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.eventlog import EVENTS_TOPIC, open_reader
from schemas.codec import decode_message
from schemas.enums import RolloutPhase
from schemas.faults import SANDBOX_FAULT, SANDBOX_FAULTS, SandboxFault
from schemas.rollout import RolloutEvent
from tests.openforge.train.checks import check_run

ROOT = Path(__file__).resolve().parents[3]
OUT = Path("runs") / "test-recovery"  # relative, as a user types it
SHORT = {
    "trainer.steps": "1",
    "evaluation.every": "1",
    "evaluation.tasks": "2",
    "evaluation.samples_per_task": "2",
    "run.output_dir": str(OUT),
}

pytestmark = pytest.mark.timeout(1200)


def _versions(path: Path) -> dict[int, int]:
    with open(path, newline="") as f:
        return {int(r["policy_version"]): int(r["rollouts"]) for r in csv.DictReader(f)}


def test_the_recovery_config_trains_with_faults_and_evaluates_clean_and_faulted() -> None:
    shutil.rmtree(ROOT / OUT, ignore_errors=True)  # a run directory left behind would resume
    argv = [sys.executable, "-m", "openforge", "train", "examples/cpu-demo-recovery.toml"]
    for key, value in SHORT.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "held-out reward with a sandbox fault in each rollout" in done.stdout, done.stdout
    assert "faults were injected into the training rollouts: command_fails_once 0.5" in done.stdout
    run = ROOT / OUT
    check_run(run, f"local:{run / 'log'}", per_update=16, updates=1)
    # Each evaluation at versions 0 and 1, clean and faulted: 2 tasks x 2 samples.
    assert _versions(run / "eval.csv") == _versions(run / "eval-faulted.csv") == {0: 4, 1: 4}
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(summary["heldout_faulted"]) == ["0", "1"]
    assert summary["faults"] == {"command_fails_once": 0.5}

    with open_reader(f"local:{run / 'log'}", [EVENTS_TOPIC], "recovery-check") as reader:
        records = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    started = {
        e.rollout_id: e.metadata.get(SANDBOX_FAULT)
        for e in records
        if isinstance(e, RolloutEvent) and e.phase is RolloutPhase.STARTED
    }
    faulted_eval = [r for r in started if "-evalf-v" in r]
    clean_eval = [r for r in started if "-eval-v" in r]
    training = [r for r in started if r not in faulted_eval and r not in clean_eval]
    assert len(faulted_eval) == 8 and len(clean_eval) == 8 and len(training) == 16
    assert all(started[r] == "command_fails_once" for r in faulted_eval)
    assert not any(started[r] for r in clean_eval)  # the clean evaluation is clean
    assert 0 < sum(started[r] is not None for r in training) < 16  # about half at rate 0.5
    verified = {
        e.rollout_id: SandboxFault.loads(e.metadata[SANDBOX_FAULTS])
        for e in records
        if isinstance(e, RolloutEvent) and e.phase is RolloutPhase.VERIFIED
        and SANDBOX_FAULTS in e.metadata
    }  # fmt: skip
    assert set(faulted_eval) <= set(verified)
    # The warm-started agent's first command is the one the fault hits, when it runs one.
    fired = [f for r in faulted_eval for f in verified[r]]
    assert fired and any(f.command.startswith("echo") for f in fired), fired
