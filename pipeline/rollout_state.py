"""How one rollout stands in episode assembly: a typed state machine, without Beam.

:class:`RolloutMachine` decides, for one rollout's frames in the order a runner delivers them
(any order, duplicates allowed) and for its two event-time timers, when the rollout settles and
what goes out: its episode, built by :mod:`pipeline.assembly` from the records that arrived, or a
dead letter (an episode with its ``dead_letter`` reason). The state it keeps is a
:class:`RolloutStore`: the frames as they arrived, each with its event time, one :class:`Flags`
cell, and the two timers. :mod:`pipeline.assemble` stores it in Beam state; the tests keep it in
memory.

Lifecycle (:class:`Status`; the only transitions are ``OPEN -> EMITTED``, ``OPEN -> CLOSED`` and
``CLOSED -> OPEN``):

- ``OPEN``: collecting. Once it has finished and its reward has arrived, it settles (at once,
  or when the watermark has passed its events: the settle timer) into its episode, unless calls
  that its records say exist have not arrived: then it waits for them. A lifecycle event saying
  the infrastructure failed dead-letters it at once (no reward will come).
- Deadline: ``lateness`` after its latest event in event time, running from its first event
  other than ``queued``, and never before ``lateness`` after the time its ``started`` event
  allows it (:data:`schemas.rollout.DEADLINE_S`: a harness may be silent for minutes). Then
  a rewarded rollout is emitted even if it never reported its end, and any other is
  dead-lettered with the reason and ``CLOSED``.
- ``EMITTED``: its episode or final dead letter is out; every later record is counted late, and
  a reward among them is dead-lettered.
- ``CLOSED``: a record later than the deadline in event time is counted late (a reward among
  them dead-lettered); one in time (a runner that fires timers early can deliver it after the
  deadline fired) reopens the rollout, whose episode then supersedes the dead letter (same id).

A frame that cannot be decoded, or records that cannot be assembled, dead-letter the rollout
with the reason; nothing is dropped silently and nothing a record holds raises out of here.

State writes are few, as a runner's state cache pays for each one: the flags cell is written
only when it changes, the deadline is set once per open period (it moves itself when it fires
early), and a completion frame is only peeked at on arrival (its record count) and decoded once,
when its rollout settles; rewards and lifecycle records (small, they decide the flags) are
decoded on arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import NamedTuple, Protocol

from pipeline.arrival import DECODE_ERRORS, Arrival, deferred
from pipeline.assembly import assemble, assemble_dead_letter, missing_events
from pipeline.rewards import MissingRewards, RewardPolicy
from schemas.codec import Record, decode_message
from schemas.episode import SUPERSEDED, Episode
from schemas.errors import OpenForgeError, SchemaError
from schemas.rollout import RETRIED, RolloutEvent

SETTLE_AFTER_US = 1000  # record times have 1 ms resolution: settle once the watermark is past


class Status(Enum):
    """Where a rollout is in its lifecycle (the values are what the flags cell stores)."""

    OPEN = ""
    EMITTED = "emitted"
    CLOSED = "closed"


_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.OPEN: frozenset({Status.EMITTED, Status.CLOSED}),
    Status.CLOSED: frozenset({Status.OPEN}),
    Status.EMITTED: frozenset(),
}


class IllegalTransition(OpenForgeError):
    """A transition :class:`Status` does not allow: a bug in this module, not a bad record."""


class Flags(NamedTuple):
    """How a rollout stands, in one state cell (one read and at most one write an element)."""

    status: Status = Status.OPEN
    finished: bool = False  # a terminal lifecycle event arrived
    rewarded: bool = False  # its reward is complete (pipeline.rewards: RewardPolicy.complete)
    began: bool = False  # an event of it other than ``queued`` arrived: its deadline is set
    names: tuple[str, ...] = ()  # the reward values' names that arrived (sorted)
    hold_us: int = 0  # its deadline is no earlier than this plus the lateness (its ``started``)

    def to(self, status: Status) -> Flags:
        if status not in _TRANSITIONS[self.status]:
            raise IllegalTransition(
                f"a rollout cannot go from {self.status.name} to {status.name}; "
                "report this as a bug in pipeline.rollout_state"
            )
        return self._replace(status=status)


class Count(Enum):
    """What the machine counts (the values are the pipeline's counter names)."""

    EVENTS_READ = "events_read"
    LATE = "late_events"  # records after the rollout's episode or deadline
    UNDECODABLE = "undecodable_frames"
    INCOMPLETE = "settled_waiting_for_calls"
    REOPENED = "reopened_after_deadline"
    EARLY = "early_deadlines_deferred"


class Outcome(NamedTuple):
    """An episode that goes out: to the episodes output, or (``dead``) to the dead letters."""

    episode: Episode
    dead: bool


class RolloutStore(Protocol):
    """One rollout's state: its flags, its frames with their event times, its two timers."""

    def flags(self) -> Flags: ...

    def write_flags(self, flags: Flags) -> None: ...

    def frames(self) -> Iterable[tuple[int, bytes]]:
        """``(began_us, frame)`` in arrival order: the frame's event time where it shows the
        rollout began (any record but ``queued``), else 0."""
        ...

    def add_frame(self, began_us: int, frame: bytes) -> None: ...

    def clear_frames(self) -> None: ...

    def set_deadline(self, at_us: int) -> None:
        """(Re)set the deadline timer to fire when the watermark reaches ``at_us``."""
        ...

    def set_settle(self, at_us: int) -> None:
        """(Re)set the settle timer to fire when the watermark reaches ``at_us``."""
        ...


def latest_us(store: RolloutStore) -> int:
    """The rollout's latest event time (0 while it has only been queued)."""
    return max((micros for micros, _ in store.frames()), default=0)


class RolloutMachine:
    """The transitions of one rollout at a time, on the state a :class:`RolloutStore` keeps.

    Args:
        lateness_us: the deadline, after the rollout's latest event, in event time.
        defer_early_deadlines: a deadline firing before its time by ``now_us`` is re-armed
            (event times are the log's wall-clock append times, so it cannot truly have passed).
        emit_at_once: settle as soon as finished and rewarded, not when the settle timer fires;
            right only where the log is delivered in offset order.
        count: adds to a counter.
        now_us: the wall clock, for episodes' build times and early deadlines.
        policy: when a rollout has its reward, and what it is (:mod:`pipeline.rewards`).
    """

    def __init__(
        self,
        lateness_us: int,
        defer_early_deadlines: bool,
        emit_at_once: bool,
        count: Callable[[Count, int], None],
        now_us: Callable[[], int],
        policy: RewardPolicy = RewardPolicy(),  # frozen: one shared default is safe
    ) -> None:
        self.lateness_us = lateness_us
        self.defer_early_deadlines = defer_early_deadlines
        self.emit_at_once = emit_at_once
        self.count = count
        self.now_us = now_us
        self.policy = policy

    def on_frame(
        self, store: RolloutStore, rollout_id: str, frame: bytes, at_us: int
    ) -> list[Outcome]:
        """A frame of the rollout arrived, stamped ``at_us`` in event time."""
        before = store.flags()
        arrival = Arrival.of(frame)
        if arrival.kind is None:
            self.count(Count.UNDECODABLE, 1)
        self.count(Count.EVENTS_READ, arrival.rows)
        if before.status is Status.EMITTED:
            return self._late(rollout_id, arrival, "reward arrived after the episode was emitted")
        flags, latest = before, 0
        if before.status is Status.CLOSED:
            latest = max(latest_us(store), before.hold_us)
            if at_us > latest + self.lateness_us:
                reason = "reward arrived after the rollout's deadline"
                return self._late(rollout_id, arrival, reason)
            # In time by event time, so the deadline fired before this element was delivered:
            # reopen, with the deadline it had. Its episode supersedes the dead letter sent.
            self.count(Count.REOPENED, 1)
            flags = flags.to(Status.OPEN)
        began = arrival.began
        store.add_frame(at_us if began else 0, frame)
        failure = arrival.infra_failure()
        if failure is not None:  # no reward will come: the orchestrator retries it as another
            return [self._infra_failed(store, rollout_id, flags, failure)]
        hold = max(flags.hold_us, arrival.hold_until_us())
        if began and (not flags.began or before.status is Status.CLOSED):
            store.set_deadline(max(latest, at_us, hold) + self.lateness_us)
        names = flags.names  # kept only where some are required (no extra state writes else)
        if arrival.reward and self.policy.required:
            names = tuple(sorted(set(names) | arrival.reward_names()))
        flags = flags._replace(
            finished=flags.finished or arrival.finished,
            rewarded=flags.rewarded or self.policy.complete(names, arrival.reward),
            began=flags.began or began,
            names=names,
            hold_us=hold,
        )
        out, flags = self._ready(store, rollout_id, flags, at_us)
        if flags != before:
            store.write_flags(flags)
        return out

    def on_settle(self, store: RolloutStore, rollout_id: str) -> list[Outcome]:
        """The settle timer fired: the watermark is past the events of a finished, rewarded
        rollout."""
        flags = store.flags()
        if flags.status is not Status.OPEN:
            return []
        out = self._settle(store, rollout_id)
        if out is None:
            return []
        store.write_flags(flags.to(Status.EMITTED))
        return [out]

    def on_deadline(self, store: RolloutStore, rollout_id: str, fired_us: int) -> list[Outcome]:
        """The deadline timer, set for ``fired_us``, fired."""
        flags = store.flags()
        if flags.status is not Status.OPEN:
            return []
        if self.defer_early_deadlines and fired_us > self.now_us():
            self.count(Count.EARLY, 1)  # the runner fired it early: ask again
            store.set_deadline(fired_us)
            return []
        due = max(latest_us(store), flags.hold_us) + self.lateness_us
        if due > fired_us:  # events came after it was set: the deadline is later
            store.set_deadline(due)
            return []
        return [self._expire(store, rollout_id, flags)]

    def _ready(
        self, store: RolloutStore, rollout_id: str, flags: Flags, at_us: int
    ) -> tuple[list[Outcome], Flags]:
        """Settle a finished, rewarded rollout now (``emit_at_once``), or arm its settle timer
        for when the watermark is past its events."""
        if not (flags.finished and flags.rewarded):
            return [], flags
        if not self.emit_at_once:
            store.set_settle(max(latest_us(store), at_us) + SETTLE_AFTER_US)
            return [], flags
        out = self._settle(store, rollout_id)
        if out is None:
            return [], flags
        return [out], flags.to(Status.EMITTED)

    def _late(self, rollout_id: str, arrival: Arrival, reason: str) -> list[Outcome]:
        """A frame after the rollout's episode or deadline: counted, and a reward dead-lettered
        (a revised score must not vanish)."""
        self.count(Count.LATE, arrival.rows)
        return [self._dead_letter(rollout_id, arrival.records, reason)] if arrival.reward else []

    def _infra_failed(
        self, store: RolloutStore, rollout_id: str, flags: Flags, failure: RolloutEvent
    ) -> Outcome:
        records, _ = self._decode(store)
        why = "infrastructure failure"
        if failure.metadata.get(RETRIED) == "true":  # its retry takes its place in the group
            why = SUPERSEDED
        out = self._dead_letter(rollout_id, records, f"{why}: {failure.message or 'no message'}")
        store.write_flags(flags.to(Status.EMITTED))  # later records count as late
        store.clear_frames()
        return out

    def _expire(self, store: RolloutStore, rollout_id: str, flags: Flags) -> Outcome:
        """The deadline has passed: emit a rewarded rollout whose calls are all here (it may
        never have reported its end); dead-letter any other."""
        records, damage = self._decode(store)
        missing = missing_events(records)
        partial = self.policy.on_missing is MissingRewards.TRAIN and bool(flags.names)  # some
        if damage or ((flags.rewarded or partial) and not missing):
            out = (
                self._dead_letter(rollout_id, records, damage)
                if damage
                else self._emit(rollout_id, records)
            )
            store.write_flags(flags.to(Status.EMITTED))  # later records count as late
            store.clear_frames()
            return out
        if missing:
            reason = f"calls it extends never arrived: {', '.join(missing)}"
        else:
            lacking = [n for n in self.policy.required if n not in flags.names]
            reason = (
                f"required rewards missing by the deadline: {', '.join(lacking)}"
                if flags.names and lacking
                else "no reward by the deadline"
            ) + ("" if flags.finished else "; the rollout never reported its end")
        store.write_flags(flags.to(Status.CLOSED))  # frames kept: in-time ones reopen it
        return self._dead_letter(rollout_id, records, reason)

    def _decode(self, store: RolloutStore) -> tuple[list[Record], str | None]:
        """The rollout's records, and why it cannot be an episode (a frame of it that cannot
        be decoded, the first in arrival order), if so."""
        records: list[Record] = []
        damage = None
        for _, frame in store.frames():
            try:
                records += decode_message(frame)
            except DECODE_ERRORS as exc:
                damage = damage or f"a frame of it cannot be decoded: {exc}"
                if deferred(frame):  # not counted on arrival: it was only peeked at then
                    self.count(Count.UNDECODABLE, 1)
        return records, damage

    def _settle(self, store: RolloutStore, rollout_id: str) -> Outcome | None:
        """The episode (or dead letter) of a finished, rewarded rollout, clearing its frames;
        None while calls it extends have not arrived yet: then it waits for them (each arrival
        settles again) or for its deadline."""
        records, damage = self._decode(store)
        if damage:
            out = self._dead_letter(rollout_id, records, damage)
        elif missing_events(records):
            self.count(Count.INCOMPLETE, 1)
            return None
        else:
            out = self._emit(rollout_id, records)
        store.clear_frames()
        return out

    def _emit(self, rollout_id: str, records: list[Record]) -> Outcome:
        """The rollout's episode, or its dead letter if its records cannot be assembled."""
        try:
            episode = assemble(rollout_id, records, created_us=self.now_us(), policy=self.policy)
            return Outcome(episode, dead=False)
        except SchemaError as exc:  # a damaged event: dead-letter the rollout, go on
            return self._dead_letter(rollout_id, records, f"cannot be assembled: {exc}")

    def _dead_letter(self, rollout_id: str, records: list[Record], reason: str) -> Outcome:
        episode = assemble_dead_letter(rollout_id, records, self.now_us(), reason, self.policy)
        return Outcome(episode, dead=True)
