"""AssembleEpisodes: a stateful, per-rollout Beam transform that joins rewards.

Input: ``(rollout_id, frame)`` pairs timestamped in event time (the frames the proxy publishes).
Each rollout's frames are buffered until it has finished and its reward has arrived and the
watermark has passed the latest of its events (then its episode is emitted: no event of it
written before can still be on its way, even when a runner splits the read and delivers parts of
the log out of order), or until its deadline (``allowed_lateness`` after its latest event,
in event time): then a rewarded rollout is emitted even if it never reported its end, and one with
no reward goes to the dead-letter output with the reason. A rollout whose calls extend an earlier
call that has not arrived (a split read can deliver it later) waits for it; a frame that cannot be
decoded, or records that cannot be assembled, dead-letter the rollout with the reason and the job
goes on. A reward arriving after the episode was emitted, or later than the deadline in event
time, also goes to the dead-letter output; every record that arrives after its rollout's episode
or deadline is counted. Nothing is dropped silently. Lateness is judged by event time: an
element within the deadline that is delivered after the deadline fired (a runner that fires
timers early, like Beam's in-process FnApiRunner, can do that) reopens the rollout with a new
deadline, and its episode supersedes the dead letter sent for it (same episode id).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.coders import BooleanCoder, BytesCoder, StrUtf8Coder, TupleCoder, VarIntCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Duration, Timestamp

from pipeline.assembly import assemble, assemble_dead_letter, missing_events
from schemas.codec import Record, decode_message, peek_rows, peek_type
from schemas.completion import CompletionEvent
from schemas.enums import TERMINAL_PHASES, RolloutPhase
from schemas.errors import SchemaError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

NAMESPACE = "openforge.pipeline"
DEAD_LETTER = "dead_letter"
EMITTED, CLOSED = "emitted", "closed"


def _queued(record: Record) -> bool:
    return isinstance(record, RolloutEvent) and record.phase is RolloutPhase.QUEUED


class _Flags(NamedTuple):
    """How a rollout stands, in one state cell (one read and one write an element)."""

    status: str = ""  # "", emitted, closed
    finished: bool = False
    rewarded: bool = False
    began: bool = False  # an event of it other than ``queued`` arrived: its deadline is set


_FLAGS_CODER = TupleCoder([StrUtf8Coder(), BooleanCoder(), BooleanCoder(), BooleanCoder()])
# A frame with its event time (micros) where it shows the rollout began (0 for ``queued``):
# the latest of those is the rollout's latest event, read only when needed, so that a call's
# arrival writes no state cell but the bag (each write costs Beam's state cache a sizing walk).
_FRAME_CODER = TupleCoder([VarIntCoder(), BytesCoder()])


def _latest(frames: Any) -> int:
    return max((micros for micros, _ in frames.read()), default=0)


def _read_flags(cell: Any) -> _Flags:
    value = cell.read()
    return _Flags(*value) if value is not None else _Flags()


class _Arrival(NamedTuple):
    """What a frame says on arrival: its record type and count, and the records of a reward or
    lifecycle frame (small, and they decide how the rollout stands). A completion frame is only
    peeked at here (:func:`peek_rows`); it is decoded once, when its rollout settles."""

    kind: type[Any] | None  # None: the frame cannot be decoded
    rows: int
    records: list[Record]


def _arrive(frame: bytes) -> _Arrival:
    try:
        kind = peek_type(frame).cls
        if kind is CompletionEvent:
            return _Arrival(kind, peek_rows(frame), [])
        records = decode_message(frame)
        return _Arrival(kind, len(records), records)
    except Exception:  # damaged: the rollout goes to the dead letters when it settles
        return _Arrival(None, 0, [])


def _deferred(frame: bytes) -> bool:
    """Whether a frame's decoding was deferred to its rollout's settling (a completion frame
    whose header and metadata were whole on arrival)."""
    try:
        return peek_type(frame).cls is CompletionEvent and peek_rows(frame) >= 0
    except Exception:
        return False


class _AssembleFn(beam.DoFn):
    FRAMES = BagStateSpec("frames", _FRAME_CODER)  # every frame of the rollout, as it arrived
    FLAGS = ReadModifyWriteStateSpec("flags", _FLAGS_CODER)
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)
    SETTLED = TimerSpec("settled", TimeDomain.WATERMARK)  # finished, rewarded, all delivered

    def __init__(
        self, allowed_lateness_s: float, defer_early_deadlines: bool, emit_at_once: bool
    ) -> None:
        self.lateness = Duration.of(allowed_lateness_s)
        self.defer_early_deadlines = defer_early_deadlines
        self.emit_at_once = emit_at_once
        self.events_read = Metrics.counter(NAMESPACE, "events_read")
        self.episodes = Metrics.counter(NAMESPACE, "episodes_emitted")
        self.dead_letters = Metrics.counter(NAMESPACE, "dead_letters")
        self.late = Metrics.counter(NAMESPACE, "late_events")  # records after episode/deadline
        self.undecodable = Metrics.counter(NAMESPACE, "undecodable_frames")
        self.incomplete = Metrics.counter(NAMESPACE, "settled_waiting_for_calls")
        self.reopened = Metrics.counter(NAMESPACE, "reopened_after_deadline")
        self.early = Metrics.counter(NAMESPACE, "early_deadlines_deferred")

    def process(
        self,
        element: tuple[str, bytes],
        timestamp: Any = beam.DoFn.TimestampParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags_cell: Any = beam.DoFn.StateParam(FLAGS),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
        settled: Any = beam.DoFn.TimerParam(SETTLED),
    ) -> Iterator[Any]:
        rollout_id, frame = element
        flags = before = _read_flags(flags_cell)
        reopened = False
        arrival = _arrive(frame)
        if arrival.kind is None:
            self.undecodable.inc()
        self.events_read.inc(arrival.rows)
        has_reward = arrival.kind is RewardEvent and arrival.rows > 0
        if flags.status == EMITTED:
            self.late.inc(arrival.rows)
            if has_reward:  # a revised reward after the episode went out
                yield self._dead_letter(
                    rollout_id, arrival.records, "reward arrived after the episode was emitted"
                )
            return
        latest = 0
        if flags.status == CLOSED:
            latest = _latest(frames)
            if timestamp.micros > latest + self.lateness.micros:
                self.late.inc(arrival.rows)
                if has_reward:
                    yield self._dead_letter(
                        rollout_id, arrival.records, "reward arrived after the rollout's deadline"
                    )
                return
            # In time by event time, so the deadline fired before this element was delivered
            # (the local runner can do that): reopen, with the deadline it had. A dead letter
            # already sent is superseded by the episode with the same episode id.
            self.reopened.inc()
            flags = flags._replace(status="")
            reopened = True
        records = arrival.records
        began = arrival.rows > 0 and (
            arrival.kind is not RolloutEvent or any(not _queued(r) for r in records)
        )
        frames.add((timestamp.micros if began else 0, frame))
        infra = [
            r
            for r in records
            if isinstance(r, RolloutEvent) and r.phase is RolloutPhase.INFRA_FAILED
        ]
        if infra:  # no reward will come: the orchestrator retries it as another rollout
            yield self._dead_letter(
                rollout_id,
                self._decode(frames)[0],
                f"infrastructure failure: {infra[0].message or 'no message'}",
            )
            flags_cell.write(flags._replace(status=EMITTED))  # later records count as late
            frames.clear()
            return
        if began and (not flags.began or reopened):
            # The deadline runs once the rollout began (it may wait in the queue for a slot any
            # time). It is set once (again when reopened), not at every element: when it fires,
            # it moves itself to the rollout's latest event + lateness if that is later.
            deadline.set(Timestamp(micros=max(latest, timestamp.micros)) + self.lateness)
        flags = _Flags(
            flags.status,
            flags.finished
            or any(isinstance(r, RolloutEvent) and r.phase in TERMINAL_PHASES for r in records),
            flags.rewarded or has_reward,
            flags.began or began,
        )
        if flags.finished and flags.rewarded:
            if self.emit_at_once:  # the runner delivers the log in order (see AssembleEpisodes)
                out = self._settle(rollout_id, frames)
                if out is not None:
                    yield out
                    flags = flags._replace(status=EMITTED)
            else:  # once the watermark is past its events (record times have 1 ms resolution)
                settled.set(Timestamp(micros=max(_latest(frames), timestamp.micros) + 1000))
        if flags != before:
            flags_cell.write(flags)

    @on_timer(SETTLED)
    def settle(
        self,
        key: Any = beam.DoFn.KeyParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags_cell: Any = beam.DoFn.StateParam(FLAGS),
    ) -> Iterator[Any]:
        flags = _read_flags(flags_cell)
        if not flags.status:
            out = self._settle(key, frames)
            if out is not None:
                yield out
                flags_cell.write(flags._replace(status=EMITTED))

    def _decode(self, frames: Any) -> tuple[list[Record], str | None]:
        """The rollout's records, and why it cannot be an episode (a frame of it that cannot
        be decoded, the first in arrival order), if so. The frames are cleared after."""
        records: list[Record] = []
        damage = None
        for _, frame in frames.read():
            try:
                records += decode_message(frame)
            except Exception as exc:
                damage = damage or f"a frame of it cannot be decoded: {exc}"
                if _deferred(frame):  # not counted on arrival: it was only peeked at then
                    self.undecodable.inc()
        return records, damage

    def _settle(self, rollout_id: str, frames: Any) -> Any:
        """The episode (or dead letter) of a finished, rewarded rollout, clearing its frames;
        None while calls it extends have not arrived yet: then it waits for them (each arrival
        settles again) or for its deadline."""
        records, damage = self._decode(frames)
        if damage:
            out = self._dead_letter(rollout_id, records, damage)
        elif missing_events(records):
            self.incomplete.inc()
            return None
        else:
            out = self._emit(rollout_id, records)
        frames.clear()
        return out

    @on_timer(DEADLINE)
    def expire(
        self,
        key: Any = beam.DoFn.KeyParam,
        fired_at: Any = beam.DoFn.TimestampParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags_cell: Any = beam.DoFn.StateParam(FLAGS),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
    ) -> Iterator[Any]:
        flags = _read_flags(flags_cell)
        if flags.status:
            return
        if self.defer_early_deadlines and fired_at.micros > time.time_ns() // 1000:
            # Event times are the log's wall-clock append times, so a deadline still in the
            # future cannot truly have passed: the runner fired early (FnApiRunner does while
            # it holds undelivered elements). Ask again; decide when it is real.
            self.early.inc()
            deadline.set(fired_at)
            return
        due = Timestamp(micros=_latest(frames)) + self.lateness
        if due > fired_at:  # events came after it was set: the deadline is later
            deadline.set(due)
            return
        records, damage = self._decode(frames)
        missing = missing_events(records)
        if damage:
            yield self._dead_letter(key, records, damage)
            flags_cell.write(flags._replace(status=EMITTED))  # later records count as late
            frames.clear()
            return
        if flags.rewarded and not missing:  # rewarded, never reported its end: train on it
            yield self._emit(key, records)
            flags_cell.write(flags._replace(status=EMITTED))
            frames.clear()
            return
        if missing:
            reason = f"calls it extends never arrived: {', '.join(missing)}"
        else:
            reason = "no reward by the deadline" + (
                "" if flags.finished else "; the rollout never reported its end"
            )
        yield self._dead_letter(key, records, reason)
        flags_cell.write(flags._replace(status=CLOSED))  # frames kept: in-time ones reopen

    def _emit(self, rollout_id: str, records: list[Record]) -> Any:
        """The rollout's episode, or its dead letter if its records cannot be assembled."""
        try:
            episode = assemble(rollout_id, records, created_us=time.time_ns() // 1000)
        except SchemaError as exc:  # a damaged event: dead-letter the rollout, go on
            return self._dead_letter(rollout_id, records, f"cannot be assembled: {exc}")
        self.episodes.inc()
        for fork in episode.forks:
            Metrics.counter(NAMESPACE, f"forks_{fork.mismatch.value}").inc()
        return episode

    def _dead_letter(self, rollout_id: str, records: list[Record], reason: str) -> Any:
        self.dead_letters.inc()
        episode = assemble_dead_letter(rollout_id, records, time.time_ns() // 1000, reason)
        return beam.pvalue.TaggedOutput(DEAD_LETTER, episode)


class AssembleEpisodes(beam.PTransform):
    """``(rollout_id, frame)`` -> episodes (main output) and ``dead_letter`` episodes.

    Both flags are for Beam's in-process FnApiRunner, which ignores the source's watermark:
    ``defer_early_deadlines`` re-arms a deadline that fires before its time by the wall clock;
    ``emit_at_once`` emits an episode as soon as its rollout is finished and rewarded instead of
    when the watermark has passed its events, which is right only where the log is delivered in
    offset order (a read that is never split). A runner that honours the watermark needs neither.
    """

    def __init__(
        self,
        allowed_lateness_s: float = 600.0,
        defer_early_deadlines: bool = False,
        emit_at_once: bool = False,
    ) -> None:
        super().__init__()
        self.allowed_lateness_s = allowed_lateness_s
        self.defer_early_deadlines = defer_early_deadlines
        self.emit_at_once = emit_at_once

    def expand(self, frames: Any) -> Any:
        return frames | "AssembleByRollout" >> beam.ParDo(
            _AssembleFn(self.allowed_lateness_s, self.defer_early_deadlines, self.emit_at_once)
        ).with_input_types(beam.typehints.Tuple[str, bytes]).with_outputs(
            DEAD_LETTER, main="episodes"
        )
