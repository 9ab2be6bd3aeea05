"""What a rollout's frame says on arrival in episode assembly (:mod:`pipeline.rollout_state`):
its record type and count, and the records of a small (reward or lifecycle) frame; a completion
frame is only peeked at here and decoded when its rollout settles."""

from __future__ import annotations

from typing import Any, NamedTuple

from pipeline.rewards import named_values
from schemas.codec import Record, decode_message, peek_rows, peek_type
from schemas.completion import CompletionEvent
from schemas.enums import TERMINAL_PHASES, RolloutPhase
from schemas.errors import SchemaError
from schemas.reward import RewardEvent
from schemas.rollout import DEADLINE_S, RolloutEvent

# What decoding a damaged frame raises: our SchemaError (header, codec, Arrow message), and from
# the conversion of its rows to records ValueError (an unknown enum value, invalid UTF-8),
# TypeError (a null where the record needs a value) and SystemError (pyarrow's conversion of a
# corrupt string buffer).
DECODE_ERRORS = (SchemaError, ValueError, TypeError, SystemError)


class Arrival(NamedTuple):
    """What a frame says on arrival: its record type and count, and the records of a reward or
    lifecycle frame. A completion frame is only peeked at (:func:`peek_rows`)."""

    kind: type[Any] | None  # None: the frame cannot be decoded
    rows: int
    records: list[Record]

    @classmethod
    def of(cls, frame: bytes) -> Arrival:
        try:
            kind = peek_type(frame).cls
            if kind is CompletionEvent:
                return cls(kind, peek_rows(frame), [])
            records = decode_message(frame)
            return cls(kind, len(records), records)
        except DECODE_ERRORS:  # damaged: the rollout goes to the dead letters when it settles
            return cls(None, 0, [])

    @property
    def reward(self) -> bool:
        return self.kind is RewardEvent and self.rows > 0

    def reward_names(self) -> set[str]:
        """The names of the values its reward events bring (:func:`named_values`)."""
        return {n for r in self.records if isinstance(r, RewardEvent) for n in named_values(r)}

    @property
    def began(self) -> bool:
        """Whether it shows the rollout began: any record but a lifecycle ``queued``."""
        return self.rows > 0 and (
            self.kind is not RolloutEvent
            or any(not _is(r, RolloutPhase.QUEUED) for r in self.records)
        )

    @property
    def finished(self) -> bool:
        return any(isinstance(r, RolloutEvent) and r.phase in TERMINAL_PHASES for r in self.records)

    def hold_until_us(self) -> int:
        """The latest time its ``started`` events allow the rollout
        (:data:`~schemas.rollout.DEADLINE_S` after each), 0 for none; a value that is not a
        number of seconds is ignored."""
        until = 0
        for r in self.records:
            if isinstance(r, RolloutEvent) and r.phase is RolloutPhase.STARTED:
                seconds = _seconds(r.metadata.get(DEADLINE_S))
                if seconds is not None:
                    until = max(until, r.at_us + int(seconds * 1_000_000))
        return until

    def infra_failure(self) -> RolloutEvent | None:
        """Its lifecycle event saying the infrastructure failed, if any."""
        for record in self.records:
            if isinstance(record, RolloutEvent) and record.phase is RolloutPhase.INFRA_FAILED:
                return record
        return None


def _seconds(value: str | None) -> float | None:
    """``value`` as a number of seconds in [0, 10^7), else None."""
    try:
        seconds = float(value or "nan")
    except ValueError:
        return None
    return seconds if 0 <= seconds < 10**7 else None


def _is(record: Record, phase: RolloutPhase) -> bool:
    return isinstance(record, RolloutEvent) and record.phase is phase


def deferred(frame: bytes) -> bool:
    """Whether a frame's decoding was deferred to its rollout's settling (a completion frame
    whose header and metadata were whole on arrival)."""
    try:
        return peek_type(frame).cls is CompletionEvent and peek_rows(frame) >= 0
    except DECODE_ERRORS:
        return False
