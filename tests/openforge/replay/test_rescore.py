"""``openforge replay rescore`` on a real run: the oracle plays two tasks in sandboxes through a
real proxy; a stricter copy of the tasks then re-scores the saved final workspaces in the
sandbox, and exactly the rewards it should change do, in the archive and in the rebuilt episodes.

The run's event archive is written here from the proxy's embedded event log with
``ArchiveWriter`` (what the pipeline's archiving does for a run)."""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path

from typer.testing import CliRunner

from infra.eventlog import EVENTS_TOPIC, open_reader
from infra.harnesses import harness
from infra.tasks import load_dataset
from openforge.cli import app
from openforge.query.views import open_views
from pipeline.jobs import Outputs, run_replay
from schemas.archive import ArchiveWriter, read_archive
from schemas.codec import Record, decode_message
from schemas.episode import episode_id_for
from schemas.reward import RewardEvent
from tests.orchestrator.conftest import job

# The verifier leaves a mark in the workspace: the saved workspace must not hold it.
LOOSE = """grep -q hello /app/answer.txt && echo 1 > /logs/verifier/reward.txt \
  || echo 0 > /logs/verifier/reward.txt
echo scored > /app/verifier-was-here
"""
STRICT = """if [ -e /app/verifier-was-here ]; then echo -1 > /logs/verifier/reward.txt; exit 0; fi
[ "$(cat /app/answer.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt \
  || echo 0 > /logs/verifier/reward.txt
"""


def _task(root: Path, name: str, answer: str, test: str) -> None:
    (root / name / "tests").mkdir(parents=True)
    (root / name / "solution").mkdir()
    (root / name / "instruction.md").write_text("Write hello to answer.txt.\n")
    (root / name / "task.toml").write_text('version = "1.0"\n[environment]\nworkdir = "/app"\n')
    (root / name / "tests" / "test.sh").write_text(test)
    (root / name / "solution" / "solve.sh").write_text(f"printf '{answer}\\n' > answer.txt\n")


def _archive_events(log_url: str, archive: Path, rewards: int) -> None:
    records: list[Record] = []
    deadline = time.monotonic() + 30
    with open_reader(log_url, [EVENTS_TOPIC], group="archiver") as reader:
        while time.monotonic() < deadline:
            for rec in reader.poll(max_records=1000, timeout=0.5):
                records += decode_message(rec.value)
            if sum(isinstance(r, RewardEvent) for r in records) >= rewards:
                break
    ArchiveWriter(archive).write(records)


def test_a_stricter_verifier_changes_exactly_the_rewards_it_should(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    tasks, strict = tmp_path / "tasks", tmp_path / "strict"
    _task(tasks, "exact", "hello", LOOSE)
    _task(tasks, "wordy", "hello world", LOOSE)
    shutil.copytree(tasks, strict)
    for name in ("exact", "wordy"):
        (strict / name / "tests" / "test.sh").write_text(STRICT)

    with job(tmp_path, harness("oracle"), tiny_model_dir) as j:
        records = j.run(load_dataset(tasks), n=2)
        log_url = j.proxy.config.log_url
    assert sorted(r.reward for r in records) == [1.0] * 4
    run = j.out
    _archive_events(log_url, run / "archive", rewards=4)
    run_replay(str(run / "archive"), Outputs(archive=str(run / "episodes")))  # the run's episodes

    # The final workspace was kept as the agent left it, before the verifier's mark.
    rollout = run / "rollouts" / records[0].rollout_id
    with tarfile.open(rollout / "final-workspace.tar.gz") as tar:
        assert tar.getnames() == ["answer.txt"]
    assert (rollout / "workspace" / "verifier-was-here").exists()
    assert json.loads((rollout / "final-workspace.json").read_text())["saved"] is True

    result = CliRunner().invoke(
        app, ["replay", "rescore", "--from", str(run), "--tasks", str(strict)]
    )
    assert result.exit_code == 0, result.output
    assert "re-score with verifier version 1" in result.output
    (total,) = [line for line in result.output.splitlines() if "total" in line]
    assert total.replace("│", " ").split() == [
        "total",
        "4",
        "2",
        "2",
    ]  # re-scored, changed, rebuilt

    report = json.loads((run / "rescore" / "v1" / "report.json").read_text())
    by_task = {r["rollout_id"]: r for r in report["rescored"]}
    assert len(by_task) == 4 and all(r["error"] is None for r in by_task.values())
    changed = {rid for rid, r in by_task.items() if r["changed"]}
    wordy = {r.rollout_id for r in records if r.task_id == "wordy"}
    assert changed == wordy  # the exact answers keep 1.0 (not -1: no verifier mark)
    assert {r["new_reward"] for r in by_task.values() if r["task_id"] == "exact"} == {1.0}

    rewards = [r for r in read_archive(run / "archive", RewardEvent) if r.verifier_version == 1]
    assert len(rewards) == 4  # published, marked with the verifier version
    assert {r.rollout_id: r.reward for r in rewards if r.rollout_id in wordy} == dict.fromkeys(
        wordy, 0.0
    )
    assert sorted(report["episodes_rebuilt"]) == sorted(episode_id_for(r) for r in wordy)

    # The episodes as a query (and replay train) sees them: the rebuilt ones carry the new reward.
    con = open_views(run=run)
    rows = con.sql(
        "SELECT rollout_id, reward, reward_components['reward'] FROM episodes ORDER BY rollout_id"
    ).fetchall()
    assert len(rows) == 4
    for rollout_id, reward, component in rows:
        assert reward == component == (0.0 if rollout_id in wordy else 1.0)
    versions = con.sql("SELECT count(*) FROM rewards WHERE verifier_version = 1").fetchall()
    assert versions == [(4,)]

    # A task set that holds none of the run's tasks re-scores nothing: that is a failure, with why.
    other = tmp_path / "other"
    _task(other, "unrelated", "hello", STRICT)
    result = CliRunner().invoke(
        app, ["replay", "rescore", "--from", str(run), "--tasks", str(other)]
    )
    assert result.exit_code == 1, result.output
    flat = " ".join(result.output.split())
    assert "0 rollouts re-scored" in flat and "nothing in" in flat, result.output
    assert "is not in" in flat  # the first skipped rollout's reason
