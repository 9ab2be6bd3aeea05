"""The orchestrator on the local backend, for real: bubblewrap sandboxes, the real proxy, the
embedded event log, the Beam pipeline. The oracle must score 1 on every example task and doing
nothing must score 0 (so every verifier can fail)."""

from __future__ import annotations

from pathlib import Path

from infra.harnesses import NoOp, Oracle
from infra.tasks import Split, load_dataset
from openforge.testing.proxy import read_events
from orchestrator.rundir import Status
from pipeline.jobs import Outputs, run_streaming
from schemas.archive import read_archive
from schemas.enums import RolloutPhase
from schemas.episode import Episode
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent
from tests.orchestrator.conftest import EXAMPLES, job


def test_oracle_scores_1_and_noop_scores_0_on_every_example(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tasks = load_dataset(EXAMPLES, split=Split.TRAIN)
    assert len(tasks) >= 3
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as oracle:
        solved = oracle.run(tasks, n=2)
        oracle.proxy.flush()
        log_url = oracle.proxy.config.log_url
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as noop:
        nothing = noop.run(tasks)
    assert {(r.task_id, r.status, r.reward) for r in solved} == {
        (t.id, Status.VERIFIED, 1.0) for t in tasks
    }
    assert len(solved) == 2 * len(tasks)
    assert {(r.task_id, r.status, r.reward) for r in nothing} == {
        (t.id, Status.VERIFIED, 0.0) for t in tasks
    }
    # The verifier's own files are kept as written, with the rollout's outputs.
    for record in solved:
        root = oracle.out / "rollouts" / record.rollout_id
        assert (root / "result.json").exists() and (root / "verifier.out").exists()
        assert any((root / "logs" / "verifier" / n).exists() for n in ("reward.txt", "reward.json"))
    assert (oracle.out / "summary.csv").read_text().count("\n") == len(solved) + 1

    # Every rollout's lifecycle and reward are in the event log ...
    records = read_events(log_url, want=len(solved) * 5)
    for r in solved:
        phases = [
            e.phase for e in records if isinstance(e, RolloutEvent) and e.rollout_id == r.rollout_id
        ]
        assert phases == [
            RolloutPhase.QUEUED,
            RolloutPhase.STARTED,
            RolloutPhase.FINISHED,
            RolloutPhase.VERIFIED,
        ]
        (reward,) = [
            e for e in records if isinstance(e, RewardEvent) and e.rollout_id == r.rollout_id
        ]
        assert reward.reward == 1.0 and reward.verifier == f"{r.task_id}@1.0"
        assert reward.components == r.components
    # ... and the pipeline joins them into episodes (no completions: the oracle calls no model).
    run_streaming(
        log_url, Outputs(None, str(tmp_path / "episodes")), allowed_lateness_s=5, stop_when_idle_s=3
    )
    episodes = list(read_archive(tmp_path / "episodes" / "episodes", Episode))
    assert {(e.rollout_id, e.reward) for e in episodes} == {(r.rollout_id, 1.0) for r in solved}
    groups = {e.group_id for e in episodes}
    assert len(groups) == len(tasks)  # the samples of a task form one group
