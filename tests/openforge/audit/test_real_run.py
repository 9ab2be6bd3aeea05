"""The audit of a real run: ``openforge rollouts run`` plays the example tasks with the oracle
harness in sandboxes behind its own proxy (rollout and reward events, no model calls) and
archives its events, the batch replay job assembles the episodes, and the page, loaded in
headless Chromium, draws exactly the charts such a run has data for; every other chart says
"no data"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from openforge.audit import html
from openforge.audit.report import CHART_NAMES, build
from tests.openforge.audit.conftest import rendered

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "openforge", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_audit_of_an_oracle_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    tasks = str(ROOT / "examples" / "tasks")
    assert "3 verified" in _run("rollouts", "run", "--tasks", tasks, "--out", str(run))
    assert (run / "archive").is_dir()  # the run archived its events itself
    _run("pipeline", "replay", "--from", str(run / "archive"), "--to", str(run / "episodes"))

    report = build(run)
    assert report.counts["rewards"] == 3 and report.counts["episodes"] == 3
    # Rollouts, not their lifecycle events (queued, started, finished, verified: 4 each).
    assert report.counts["rollouts"] == 3
    assert report.counts["lifecycle events"] == 12 and report.counts["calls"] == 0
    dom = rendered(html.write(report, tmp_path / "audit.html"), tmp_path)
    assert [c["data-chart"] for c in dom.charts] == list(CHART_NAMES)
    drawn = {c["data-chart"]: int(c["data-marks"] or 0) for c in dom.charts}
    # One bar per task and one for the oracle harness; the oracle's cost in five phases (no
    # model time: it calls none); its three rollouts on the timeline (no trainer in such a run).
    assert {k: v for k, v in drawn.items() if v} == {
        "reward_by_task": 3,
        "reward_by_harness": 1,
        "cost_per_rollout": 5,
        "timeline": 3,
    }
    assert all(c["data-rendered-marks"] == c["data-marks"] for c in dom.charts)
    assert dom.no_data == len(CHART_NAMES) - 4
