"""``openforge replay rebuild``'s check: archived and rebuilt episodes compared record for record
(ids and contents, in no order), each kind of difference reported; bad paths refused clearly.
The rebuild of a real run's archive is tested in tests/openforge/train/test_run.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openforge.cli import app
from openforge.replay.rebuild import compare, latest_episodes, rebuild, run_lateness
from openforge.testing.rollouts import make_rollout
from pipeline.assembly import assemble
from schemas.archive import ArchiveWriter
from schemas.episode import Episode
from schemas.errors import ConfigError


def _episodes(n: int) -> list[Episode]:
    return [
        assemble(f"r{i}", make_rollout(i, f"r{i}", calls=4).records, created_us=i) for i in range(n)
    ]


def test_equal_episodes_in_any_order_and_build_time_are_identical() -> None:
    built = _episodes(4)
    again = [replace(e, created_us=e.created_us + 10**6) for e in reversed(built)]
    diff = compare(latest_episodes(built), latest_episodes(again))
    assert diff.identical and not diff.unsettled


def test_every_kind_of_difference_is_reported() -> None:
    a, b, c, d = _episodes(4)
    archived = [a, b, c]
    never_settled = replace(d, dead_letter="no reward by the deadline", samples=[], reward=None)
    rebuilt = [replace(a, reward=(a.reward or 0) + 1.0), c, never_settled]
    diff = compare(latest_episodes(archived), latest_episodes(rebuilt))
    assert diff.differing == {a.episode_id: ["reward"]}
    assert diff.only_archived == [b.episode_id] and diff.only_rebuilt == []
    assert diff.unsettled == [d.episode_id]  # counted apart, not a difference
    assert not diff.identical
    diff = compare(latest_episodes([a]), latest_episodes([a, replace(d, created_us=0)]))
    assert diff.only_rebuilt == [d.episode_id] and not diff.identical


def test_of_an_episodes_records_the_episode_over_its_dead_letter_then_the_latest() -> None:
    (a,) = _episodes(1)
    dead = replace(a, dead_letter="no reward by the deadline", created_us=a.created_us + 5)
    later = replace(a, created_us=a.created_us + 9)
    assert latest_episodes([a, dead])[a.episode_id] is a
    assert latest_episodes([dead, a, later])[a.episode_id] is later


def test_bad_paths_are_refused_with_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        rebuild(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ConfigError, match="is not an archive"):
        rebuild(tmp_path, tmp_path / "out")
    only_episodes = tmp_path / "run" / "archive"
    ArchiveWriter(only_episodes).write(_episodes(1))
    with pytest.raises(ConfigError, match="no completion, rollout or reward events"):
        rebuild(tmp_path / "run", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    result = CliRunner().invoke(
        app, ["replay", "rebuild", "--from", str(only_episodes), "--to", str(tmp_path / "full")]
    )
    assert result.exit_code != 0 and "is not empty" in str(result.exception)


def test_the_lateness_is_the_runs_own(tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    assert run_lateness(tmp_path / "archive") == 600.0
    (tmp_path / "config.toml").write_text("[pipeline]\nlateness_s = 60.0\n")
    assert run_lateness(tmp_path / "archive") == 60.0
