"""The cost views over an archive written as a run writes it: what each verified rollout cost
(its recorded costs, its calls' tokens and model time, reward -> episode -> update) and where
each training step's time went."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from openforge.query.views import open_views
from openforge.testing.rollouts import T0, make_rollout
from pipeline.assembly import assemble
from schemas.archive import ArchiveWriter
from schemas.completion import CompletionEvent, Timings
from schemas.enums import RolloutPhase
from schemas.rollout import COSTS, RolloutEvent
from trainer.lineage import step_record

COSTS_R1 = {
    "queued_s": 0.5,
    "prepare_s": 0.2,
    "agent_s": 3.0,
    "agent_cpu_s": 1.25,
    "agent_peak_mib": 100.0,
    "save_s": 0.125,
    "verifier_s": 1.0,
    "wall_s": 5.0,
}
MODEL_S = 0.25  # each call's time at the proxy


def _timed(event: CompletionEvent) -> CompletionEvent:
    received = event.timings.received_us
    return replace(event, timings=Timings(received, received + 1000, received + 250_000))


def _verified(rollout_id: str, costs: dict[str, float]) -> RolloutEvent:
    return RolloutEvent(
        f"ro_{rollout_id}_verified",
        rollout_id,
        RolloutPhase.VERIFIED,
        T0 + 2 * 10**6,
        task_id="task",
        harness="h",
        backend="local",
        costs=costs,
    )


@pytest.fixture
def archive(tmp_path: Path) -> tuple[Path, list[CompletionEvent]]:
    writer = ArchiveWriter(tmp_path / "archive")
    r1 = make_rollout(1, "r1", calls=4)
    records = [_timed(r) if isinstance(r, CompletionEvent) else r for r in r1.records]
    writer.write(records)
    writer.write([_verified("r1", COSTS_R1)] * 2)  # delivered twice: one row
    writer.write([_verified("r2", {"agent_s": 1.0, "wall_s": 1.5})])
    episode = assemble("r1", records, created_us=T0 + 7 * 10**6)  # reward at T0 + 1 s
    writer.write([episode])
    metrics = {"time/step_s": 2.0, "time/wait_s": 0.5, "sync/seconds": 0.25}
    first = step_record(1, 1, [episode], [None], {**metrics, "engine/busy_fraction": 0.75})
    second = step_record(2, 2, [], [], metrics, at_us=T0 + 12 * 10**6)
    writer.write([replace(first, at_us=T0 + 9 * 10**6), second])
    calls = [r for r in records if isinstance(r, CompletionEvent)]
    return tmp_path / "archive", list({c.event_id: c for c in calls}.values())


def test_each_verified_rollout_its_costs_tokens_and_the_path_to_its_update(
    archive: tuple[Path, list[CompletionEvent]],
) -> None:
    root, calls = archive
    con = open_views(root)
    rows = con.sql("SELECT * FROM rollout_costs ORDER BY rollout_id")
    names = [d[0] for d in rows.description]
    r1, r2 = (dict(zip(names, row, strict=True)) for row in rows.fetchall())
    assert {k: r1[k] for k in COSTS} == {k: COSTS_R1.get(k) for k in COSTS}
    assert r1["calls"] == len(calls)
    assert r1["tokens_in"] == sum(c.prompt_length for c in calls)
    assert r1["tokens_out"] == sum(len(c.completion_token_ids) for c in calls)
    assert r1["model_s"] == pytest.approx(MODEL_S * len(calls))
    assert r1["harness_s"] == pytest.approx(3.0 - MODEL_S * len(calls))
    assert r1["reward_to_episode_s"] == pytest.approx(6.0)
    assert (r1["step"], r1["episode_to_update_s"]) == (1, pytest.approx(2.0))
    # Measured costs only: what the backend could not measure is null, never 0.
    assert (r2["agent_s"], r2["wall_s"], r2["agent_cpu_s"]) == (1.0, 1.5, None)
    assert (r2["calls"], r2["step"], r2["reward_to_episode_s"]) == (0, None, None)


def test_each_step_where_the_trainers_time_went(
    archive: tuple[Path, list[CompletionEvent]],
) -> None:
    con = open_views(archive[0])
    rows = con.sql(
        "SELECT step, episodes, compute_s, wait_s, sync_s, engine_busy, since_previous_s "
        "FROM step_costs ORDER BY step"
    ).fetchall()
    assert rows == [(1, 1, 2.0, 0.5, 0.25, 0.75, None), (2, 0, 2.0, 0.5, 0.25, None, 3.0)]
