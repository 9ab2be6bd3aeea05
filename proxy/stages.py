"""The stages of one call and the steps between them: the pure core of
:class:`proxy.lifecycle.CallLifecycle`, which does the I/O of each step.

    NEW --admit--> ADMITTED --number--> NUMBERED --settle--> SETTLED --record--> RECORDED
                      |                                                             |
                      +---------------------------exit----------> EXITED <---exit---+

``admit`` takes a concurrency slot, ``exit`` gives it back: a call holds it from ADMITTED until
EXITED. ``number`` gives the call its index in the rollout; ``settle`` decides its status, once;
``record`` publishes its completion event, once. Only ADMITTED (no index: nothing to record) and
RECORDED may exit, so a numbered call is recorded exactly once before its slot is given back;
:func:`exit_steps` are the steps the single exit takes from where the call is. Any other step
raises :class:`IllegalTransition` and leaves the stage as it was.
"""

from __future__ import annotations

from enum import Enum

from schemas.errors import OpenForgeError


class Stage(Enum):
    NEW = "new"  # made, holds nothing
    ADMITTED = "admitted"  # holds a slot
    NUMBERED = "numbered"  # has its call index: it will be recorded
    SETTLED = "settled"  # its status is decided
    RECORDED = "recorded"  # its completion event is published
    EXITED = "exited"  # its slot is given back; nothing follows


class Step(Enum):
    ADMIT = "admit"
    NUMBER = "number"
    SETTLE = "settle"
    RECORD = "record"
    EXIT = "exit"


# step -> {the stage it may be taken from: the stage it leads to}
TRANSITIONS: dict[Step, dict[Stage, Stage]] = {
    Step.ADMIT: {Stage.NEW: Stage.ADMITTED},
    Step.NUMBER: {Stage.ADMITTED: Stage.NUMBERED},
    Step.SETTLE: {Stage.NUMBERED: Stage.SETTLED},
    Step.RECORD: {Stage.SETTLED: Stage.RECORDED},
    Step.EXIT: {Stage.ADMITTED: Stage.EXITED, Stage.RECORDED: Stage.EXITED},
}


class IllegalTransition(OpenForgeError):
    """A step taken from a stage it may not be taken from: a bug in the proxy; please report
    it with the traceback."""

    def __init__(self, stage: Stage, step: Step) -> None:
        allowed = ", ".join(s.value for s in TRANSITIONS[step]) or "none"
        super().__init__(
            f"a call in stage {stage.value!r} cannot {step.value} (only from: {allowed}): "
            "a bug in the proxy; please report it with the traceback"
        )
        self.stage, self.step = stage, step


def advance(stage: Stage, step: Step) -> Stage:
    """The stage ``step`` leads to from ``stage``; IllegalTransition if it may not be taken."""
    try:
        return TRANSITIONS[step][stage]
    except KeyError:
        raise IllegalTransition(stage, step) from None


_EXIT_STEPS: dict[Stage, tuple[Step, ...]] = {
    Stage.ADMITTED: (Step.EXIT,),
    Stage.NUMBERED: (Step.SETTLE, Step.RECORD, Step.EXIT),
    Stage.SETTLED: (Step.RECORD, Step.EXIT),
    Stage.RECORDED: (Step.EXIT,),
}


def exit_steps(stage: Stage) -> tuple[Step, ...]:
    """The steps the single exit takes from ``stage``: settle a numbered call that is not
    settled yet, record a settled one, then exit. IllegalTransition from a stage that holds no
    slot (NEW, EXITED): there is nothing to exit."""
    try:
        return _EXIT_STEPS[stage]
    except KeyError:
        raise IllegalTransition(stage, Step.EXIT) from None
