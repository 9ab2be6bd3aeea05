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
from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder, BytesCoder, StrUtf8Coder
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
from schemas.codec import Record, decode_message, decode_messages
from schemas.enums import TERMINAL_PHASES, RolloutPhase
from schemas.errors import SchemaError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

NAMESPACE = "openforge.pipeline"
DEAD_LETTER = "dead_letter"
EMITTED, CLOSED = "emitted", "closed"


def _queued(record: Record) -> bool:
    return isinstance(record, RolloutEvent) and record.phase is RolloutPhase.QUEUED


class _AssembleFn(beam.DoFn):
    FRAMES = BagStateSpec("frames", BytesCoder())
    FINISHED = ReadModifyWriteStateSpec("finished", BooleanCoder())
    REWARDED = ReadModifyWriteStateSpec("rewarded", BooleanCoder())
    STATUS = ReadModifyWriteStateSpec("status", StrUtf8Coder())  # "", emitted, closed
    LATEST = ReadModifyWriteStateSpec("latest", StrUtf8Coder())  # latest event time (micros)
    DAMAGED = ReadModifyWriteStateSpec("damaged", StrUtf8Coder())  # why it cannot be an episode
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
        finished: Any = beam.DoFn.StateParam(FINISHED),
        rewarded: Any = beam.DoFn.StateParam(REWARDED),
        status: Any = beam.DoFn.StateParam(STATUS),
        latest: Any = beam.DoFn.StateParam(LATEST),
        damaged: Any = beam.DoFn.StateParam(DAMAGED),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
        settled: Any = beam.DoFn.TimerParam(SETTLED),
    ) -> Iterator[Any]:
        rollout_id, frame = element
        state = status.read()
        try:
            records = decode_message(frame)
        except Exception as exc:  # damaged: the rollout goes to the dead letters when it settles
            self.undecodable.inc()
            records = []
            if not damaged.read():
                damaged.write(f"a frame of it cannot be decoded: {exc}")
        self.events_read.inc(len(records))
        has_reward = any(isinstance(r, RewardEvent) for r in records)
        if state == EMITTED:
            self.late.inc(len(records))
            if has_reward:  # a revised reward after the episode went out
                yield self._dead_letter(
                    rollout_id, records, "reward arrived after the episode was emitted"
                )
            return
        if state == CLOSED:
            if timestamp.micros > int(latest.read() or 0) + self.lateness.micros:
                self.late.inc(len(records))
                if has_reward:
                    yield self._dead_letter(
                        rollout_id, records, "reward arrived after the rollout's deadline"
                    )
                return
            # In time by event time, so the deadline fired before this element was delivered
            # (the local runner can do that): reopen, with the deadline it had. A dead letter
            # already sent is superseded by the episode with the same episode id.
            self.reopened.inc()
            status.write("")
        if records:
            frames.add(frame)
        infra = [
            r
            for r in records
            if isinstance(r, RolloutEvent) and r.phase is RolloutPhase.INFRA_FAILED
        ]
        if infra:  # no reward will come: the orchestrator retries it as another rollout
            yield self._dead_letter(
                rollout_id,
                decode_messages(frames.read()),
                f"infrastructure failure: {infra[0].message or 'no message'}",
            )
            status.write(EMITTED)  # settled: later records of it are counted as late
            frames.clear()
            return
        if any(isinstance(r, RolloutEvent) and r.phase in TERMINAL_PHASES for r in records):
            finished.write(True)
        if has_reward:
            rewarded.write(True)
        micros = max(int(latest.read() or 0), timestamp.micros)
        if any(not _queued(r) for r in records):  # the deadline runs once the rollout began:
            latest.write(str(micros))  # a rollout may wait in the queue for a slot any time
            deadline.set(Timestamp(micros=micros) + self.lateness)  # reopened ones too
        if finished.read() and rewarded.read():
            if self.emit_at_once:  # the runner delivers the log in order (see AssembleEpisodes)
                yield from self._settle(rollout_id, frames, status, damaged)
            else:  # once the watermark is past its events (record times have 1 ms resolution)
                settled.set(Timestamp(micros=micros + 1000))

    @on_timer(SETTLED)
    def settle(
        self,
        key: Any = beam.DoFn.KeyParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        status: Any = beam.DoFn.StateParam(STATUS),
        damaged: Any = beam.DoFn.StateParam(DAMAGED),
    ) -> Iterator[Any]:
        if not status.read():
            yield from self._settle(key, frames, status, damaged)

    def _settle(self, rollout_id: str, frames: Any, status: Any, damaged: Any) -> Iterator[Any]:
        """Emit the episode of a finished, rewarded rollout, unless calls it extends have not
        arrived yet: then it waits for them (each arrival settles again) or for its deadline."""
        records = decode_messages(frames.read())
        if damaged.read():
            yield self._dead_letter(rollout_id, records, damaged.read())
        elif missing_events(records):
            self.incomplete.inc()
            return
        else:
            yield self._emit(rollout_id, records)
        status.write(EMITTED)
        frames.clear()

    @on_timer(DEADLINE)
    def expire(
        self,
        key: Any = beam.DoFn.KeyParam,
        fired_at: Any = beam.DoFn.TimestampParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        rewarded: Any = beam.DoFn.StateParam(REWARDED),
        finished: Any = beam.DoFn.StateParam(FINISHED),
        status: Any = beam.DoFn.StateParam(STATUS),
        damaged: Any = beam.DoFn.StateParam(DAMAGED),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
    ) -> Iterator[Any]:
        if status.read():
            return
        if self.defer_early_deadlines and fired_at.micros > time.time_ns() // 1000:
            # Event times are the log's wall-clock append times, so a deadline still in the
            # future cannot truly have passed: the runner fired early (FnApiRunner does while
            # it holds undelivered elements). Ask again; decide when it is real.
            self.early.inc()
            deadline.set(fired_at)
            return
        records = decode_messages(frames.read())
        missing = missing_events(records)
        if damaged.read():
            yield self._dead_letter(key, records, damaged.read())
            status.write(EMITTED)  # settled: later records of it are counted as late
            frames.clear()
            return
        if rewarded.read() and not missing:  # rewarded, never reported its end: train on it
            yield self._emit(key, records)
            status.write(EMITTED)
            frames.clear()
            return
        if missing:
            reason = f"calls it extends never arrived: {', '.join(missing)}"
        else:
            reason = "no reward by the deadline" + (
                "" if finished.read() else "; the rollout never reported its end"
            )
        yield self._dead_letter(key, records, reason)
        status.write(CLOSED)  # frames are kept: an element in time by event time reopens

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
