"""Where a run directory keeps its rollouts."""

from __future__ import annotations

from pathlib import Path

from orchestrator.rundir import RunDir


def test_a_training_runs_rollouts_and_evaluations_are_found(tmp_path: Path) -> None:
    """A training run keeps two job directories (``rollouts/``, ``eval/``); a rollouts run is
    one; a directory of neither holds none (and is left as it was)."""
    assert RunDir.found_in(tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    RunDir(tmp_path / "rollouts")
    RunDir(tmp_path / "eval")
    assert [d.root for d in RunDir.found_in(tmp_path)] == [tmp_path / "rollouts", tmp_path / "eval"]
    job = tmp_path / "job"
    RunDir(job)
    assert [d.root for d in RunDir.found_in(job)] == [job]
