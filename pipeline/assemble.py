"""AssembleEpisodes: the per-rollout Beam transform that joins rewards and builds episodes.

Input: ``(rollout_id, frame)`` pairs timestamped in event time (the frames the proxy publishes).
Outputs: each rollout's episode (main output) and ``dead_letter`` episodes, each with its reason;
nothing is dropped silently. When a rollout settles, what its deadline is and how late, duplicate
and damaged records are handled is :mod:`pipeline.rollout_state`, a state machine without Beam;
this module keeps its state in Beam state (keyed by rollout id: a bag of frames, one flags cell,
an event-time deadline timer and an event-time settle timer) and counts what it does with
``Metrics.counter`` in ``openforge.pipeline``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import (
    BooleanCoder,
    BytesCoder,
    IterableCoder,
    StrUtf8Coder,
    TupleCoder,
    VarIntCoder,
)
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Duration, Timestamp

from pipeline.rewards import RewardPolicy
from pipeline.rollout_state import Count, Flags, Outcome, RolloutMachine, Status

NAMESPACE = "openforge.pipeline"
DEAD_LETTER = "dead_letter"

# The flags cell: (status value, finished, rewarded, began, reward names, hold_us).
_FLAGS_CODER = TupleCoder(
    [
        StrUtf8Coder(),
        BooleanCoder(),
        BooleanCoder(),
        BooleanCoder(),
        IterableCoder(StrUtf8Coder()),
        VarIntCoder(),
    ]
)
# A frame with its event time (micros) where it shows the rollout began (0 for ``queued``):
# the latest of those is the rollout's latest event, read only when needed, so that a call's
# arrival writes no state cell but the bag.
_FRAME_CODER = TupleCoder([VarIntCoder(), BytesCoder()])


_STATUS = {status.value: status for status in Status}


def _now_us() -> int:
    return time.time_ns() // 1000


class _BeamStore:
    """A rollout's :class:`~pipeline.rollout_state.RolloutStore` in Beam state. The timers are
    None in a callback that cannot set them (the settle timer's, which sets none)."""

    __slots__ = ("_bag", "_cell", "_deadline", "_settled")

    def __init__(self, bag: Any, cell: Any, deadline: Any = None, settled: Any = None) -> None:
        self._bag, self._cell, self._deadline, self._settled = bag, cell, deadline, settled

    def flags(self) -> Flags:
        value = self._cell.read()
        if value is None:
            return Flags()
        status, finished, rewarded, began, names, hold_us = value
        return Flags(_STATUS[status], finished, rewarded, began, tuple(names), hold_us)

    def write_flags(self, flags: Flags) -> None:
        self._cell.write(
            (
                flags.status.value,
                flags.finished,
                flags.rewarded,
                flags.began,
                list(flags.names),
                flags.hold_us,
            )
        )

    def frames(self) -> Iterable[tuple[int, bytes]]:
        frames: Iterable[tuple[int, bytes]] = self._bag.read()
        return frames

    def add_frame(self, began_us: int, frame: bytes) -> None:
        self._bag.add((began_us, frame))

    def clear_frames(self) -> None:
        self._bag.clear()

    def set_deadline(self, at_us: int) -> None:
        self._deadline.set(Timestamp(micros=at_us))

    def set_settle(self, at_us: int) -> None:
        self._settled.set(Timestamp(micros=at_us))


class _AssembleFn(beam.DoFn):
    FRAMES = BagStateSpec("frames", _FRAME_CODER)  # every frame of the rollout, as it arrived
    FLAGS = ReadModifyWriteStateSpec("flags", _FLAGS_CODER)
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)
    SETTLED = TimerSpec("settled", TimeDomain.WATERMARK)  # finished, rewarded, all delivered

    def __init__(
        self,
        allowed_lateness_s: float,
        defer_early_deadlines: bool,
        emit_at_once: bool,
        policy: RewardPolicy,
    ) -> None:
        self.lateness_us = Duration.of(allowed_lateness_s).micros
        self.defer_early_deadlines = defer_early_deadlines
        self.emit_at_once = emit_at_once
        self.policy = policy
        self.counters = {c: Metrics.counter(NAMESPACE, c.value) for c in Count}
        self.episodes = Metrics.counter(NAMESPACE, "episodes_emitted")
        self.dead_letters = Metrics.counter(NAMESPACE, "dead_letters")

    def setup(self) -> None:
        self.machine = RolloutMachine(
            self.lateness_us, self.defer_early_deadlines, self.emit_at_once, self._count, _now_us,
            self.policy,
        )  # fmt: skip

    def _count(self, what: Count, n: int) -> None:
        self.counters[what].inc(n)

    def process(
        self,
        element: tuple[str, bytes],
        timestamp: Any = beam.DoFn.TimestampParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags: Any = beam.DoFn.StateParam(FLAGS),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
        settled: Any = beam.DoFn.TimerParam(SETTLED),
    ) -> Iterator[Any]:
        rollout_id, frame = element
        store = _BeamStore(frames, flags, deadline, settled)
        yield from self._out(self.machine.on_frame(store, rollout_id, frame, timestamp.micros))

    @on_timer(SETTLED)
    def settle(
        self,
        key: Any = beam.DoFn.KeyParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags: Any = beam.DoFn.StateParam(FLAGS),
    ) -> Iterator[Any]:
        yield from self._out(self.machine.on_settle(_BeamStore(frames, flags), key))

    @on_timer(DEADLINE)
    def expire(
        self,
        key: Any = beam.DoFn.KeyParam,
        fired_at: Any = beam.DoFn.TimestampParam,
        frames: Any = beam.DoFn.StateParam(FRAMES),
        flags: Any = beam.DoFn.StateParam(FLAGS),
        deadline: Any = beam.DoFn.TimerParam(DEADLINE),
    ) -> Iterator[Any]:
        store = _BeamStore(frames, flags, deadline)
        yield from self._out(self.machine.on_deadline(store, key, fired_at.micros))

    def _out(self, outcomes: list[Outcome]) -> Iterator[Any]:
        """Episodes to the main output, dead letters to ``dead_letter``, each counted."""
        for outcome in outcomes:
            if outcome.dead:
                self.dead_letters.inc()
                yield beam.pvalue.TaggedOutput(DEAD_LETTER, outcome.episode)
                continue
            self.episodes.inc()
            for fork in outcome.episode.forks:
                Metrics.counter(NAMESPACE, f"forks_{fork.mismatch.value}").inc()
            yield outcome.episode


class AssembleEpisodes(beam.PTransform):
    """``(rollout_id, frame)`` -> episodes (main output) and ``dead_letter`` episodes.

    Both flags are for Beam's in-process FnApiRunner, which ignores the source's watermark:
    ``defer_early_deadlines`` re-arms a deadline that fires before its time by the wall clock;
    ``emit_at_once`` emits an episode as soon as its rollout is finished and rewarded instead of
    when the watermark has passed its events, which is right only where the log is delivered in
    offset order (a read that is never split). A runner that honours the watermark needs neither.
    ``policy``: when a rollout has its reward, and what it is (:mod:`pipeline.rewards`).
    """

    def __init__(
        self,
        allowed_lateness_s: float = 600.0,
        defer_early_deadlines: bool = False,
        emit_at_once: bool = False,
        policy: RewardPolicy = RewardPolicy(),  # frozen: one shared default is safe
    ) -> None:
        super().__init__()
        self.policy = policy
        self.allowed_lateness_s = allowed_lateness_s
        self.defer_early_deadlines = defer_early_deadlines
        self.emit_at_once = emit_at_once

    def expand(self, frames: Any) -> Any:
        return frames | "AssembleByRollout" >> beam.ParDo(
            _AssembleFn(
                self.allowed_lateness_s, self.defer_early_deadlines, self.emit_at_once, self.policy
            )
        ).with_input_types(beam.typehints.Tuple[str, bytes]).with_outputs(
            DEAD_LETTER, main="episodes"
        )
