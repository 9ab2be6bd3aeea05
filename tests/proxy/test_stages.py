"""The call's stages on their own (:mod:`proxy.stages`, no app, no I/O): any sequence of steps
keeps the lifecycle's promises, and a step out of order raises and changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.stages import TRANSITIONS, IllegalTransition, Stage, Step, advance, exit_steps

steps = st.lists(st.sampled_from(list(Step)), max_size=20)


def run(sequence: list[Step]) -> tuple[Stage, list[Step]]:
    """Apply ``sequence`` from NEW, skipping the steps that raise (each must leave the stage as
    it was); the last stage and the steps that were taken."""
    stage, taken = Stage.NEW, []
    for step in sequence:
        try:
            stage = advance(stage, step)
        except IllegalTransition as exc:
            assert (exc.stage, exc.step) == (stage, step)
            continue
        taken.append(step)
    return stage, taken


@given(st.sampled_from(list(Stage)), st.sampled_from(list(Step)))
def test_a_step_is_taken_only_from_where_the_table_allows(stage: Stage, step: Step) -> None:
    if stage in TRANSITIONS[step]:
        assert advance(stage, step) is TRANSITIONS[step][stage]
    else:
        with pytest.raises(IllegalTransition, match="a bug in the proxy"):
            advance(stage, step)


@given(steps)
def test_any_sequence_keeps_the_order_of_a_call(sequence: list[Step]) -> None:
    stage, taken = run(sequence)
    # Admission comes first, and the slot is given back at most once, last.
    assert taken[:1] in ([], [Step.ADMIT]) and taken.count(Step.ADMIT) <= 1
    assert taken.count(Step.EXIT) <= 1 and Step.EXIT not in taken[:-1]
    # A call is numbered, settled and recorded at most once each, in that order.
    for step in (Step.NUMBER, Step.SETTLE, Step.RECORD):
        assert taken.count(step) <= 1
    order = [s for s in taken if s in (Step.NUMBER, Step.SETTLE, Step.RECORD)]
    assert order == [Step.NUMBER, Step.SETTLE, Step.RECORD][: len(order)]
    # A numbered call does not give its slot back unrecorded.
    if Step.EXIT in taken and Step.NUMBER in taken:
        assert Step.RECORD in taken
    assert (stage is Stage.EXITED) == (Step.EXIT in taken)


@given(steps)
def test_the_exit_from_anywhere_a_slot_is_held_records_a_numbered_call_once(
    sequence: list[Step],
) -> None:
    stage, taken = run([s for s in sequence if s is not Step.EXIT])
    if stage is Stage.NEW:
        with pytest.raises(IllegalTransition):
            exit_steps(stage)
        return
    plan = exit_steps(stage)
    for step in plan:
        stage = advance(stage, step)
    assert stage is Stage.EXITED and plan[-1] is Step.EXIT
    whole = taken + list(plan)
    assert whole.count(Step.RECORD) == whole.count(Step.NUMBER) <= 1
    with pytest.raises(IllegalTransition):
        exit_steps(stage)  # the single exit: nothing is left to exit
    for step in Step:
        with pytest.raises(IllegalTransition):
            advance(stage, step)  # nothing follows the exit


def test_every_stage_is_reached() -> None:
    reached = {Stage.NEW} | {to for moves in TRANSITIONS.values() for to in moves.values()}
    assert reached == set(Stage)
