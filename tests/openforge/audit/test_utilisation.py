"""Utilisation from a run's timeline: rollouts in sandbox slots, each stage's busy fraction over
the run's wall time, and the stage that bounded it."""

from __future__ import annotations

import pytest

from openforge.audit.cost_queries import COST_QUERIES
from openforge.audit.queries import Result
from openforge.audit.utilisation import bounded_by, lanes, slots, utilisation

TIMELINE, STEPS = (next(q for q in COST_QUERIES if q.name == n) for n in ("timeline", "step_costs"))


def _timeline(rows: list[tuple[str, str, float, float]]) -> Result:
    return Result(TIMELINE, ["kind", "label", "start_s", "end_s"], list(rows))


def _steps(rows: list[tuple[float | None, float | None]]) -> Result:
    return Result(STEPS, ["engine_busy", "since_previous_s"], list(rows))


def test_each_rollout_takes_the_first_slot_free_at_its_start() -> None:
    spans = [(0.0, 4.0, "rollout", "a"), (1.0, 2.0, "rollout", "b"), (2.0, 3.0, "rollout", "c")]
    spans.append((4.0, 5.0, "evaluation", "d"))
    assert [[s[3] for s in lane] for lane in slots(spans)] == [["a", "d"], ["b", "c"]]


def test_busy_fractions_and_the_stage_that_bounded_the_run() -> None:
    timeline = _timeline(
        [
            ("rollout", "a", 0.0, 8.0),
            ("rollout", "b", 0.0, 6.0),
            ("update", "step 1", 8.0, 9.0),
            ("sync", "v1", 9.0, 10.0),
        ]
    )
    busy = utilisation(timeline, _steps([(0.25, 4.0), (0.75, 6.0), (None, 1.0)]))
    rows = {stage: (fraction, top) for stage, fraction, top in busy.rows}
    assert rows["sandbox slots (2)"] == (pytest.approx(14 / 20), True)  # two slots, 10 s
    assert rows["trainer"] == (pytest.approx(2 / 10), False)
    assert rows["engine"] == (pytest.approx((0.25 * 4 + 0.75 * 6) / 10), False)  # by length
    assert bounded_by(busy) == "bounded by the sandbox slots (2): busy 70% of the run's wall time"
    assert [name for name, _ in lanes(timeline)] == ["slot 1", "slot 2", "trainer"]


def test_a_run_with_nothing_recorded_says_so() -> None:
    busy = utilisation(_timeline([]), _steps([]))
    assert busy.rows == [] and bounded_by(busy).startswith("not enough records")
