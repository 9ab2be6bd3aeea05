"""The rollout state machine's runner in tests: its state in memory, an honest watermark.

:class:`Runner` plays a runner's part for :class:`pipeline.rollout_state.RolloutMachine`: it
delivers frames, moves the watermark where it is told (a test never moves it past an event still
to be delivered) and fires the event-time timers that the watermark has reached, earliest first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pipeline.rewards import RewardPolicy
from pipeline.rollout_state import Count, Flags, Outcome, RolloutMachine
from schemas.codec import Record, encode_message

NOW = 4_000_000_000_000_000  # the wall clock the machine sees: past every event time here
LATENESS = 10_000_000  # 10 s of event time
START = 1_000_000_000  # event time of a rollout's first frame


class MemoryStore:
    """A rollout's state in memory; it checks the promise that a write changes the flags."""

    def __init__(self) -> None:
        self.cell: Flags | None = None
        self.bag: list[tuple[int, bytes]] = []
        self.timers: dict[str, int] = {}
        self.flag_writes = 0
        self.deadline_sets = 0

    def flags(self) -> Flags:
        return self.cell if self.cell is not None else Flags()

    def write_flags(self, flags: Flags) -> None:
        assert flags != self.flags(), "the flags cell is written only when it changes"
        self.cell = flags
        self.flag_writes += 1

    def frames(self) -> list[tuple[int, bytes]]:
        return list(self.bag)

    def add_frame(self, began_us: int, frame: bytes) -> None:
        self.bag.append((began_us, frame))

    def clear_frames(self) -> None:
        self.bag.clear()

    def set_deadline(self, at_us: int) -> None:
        self.timers["deadline"] = at_us
        self.deadline_sets += 1

    def set_settle(self, at_us: int) -> None:
        self.timers["settle"] = at_us


@dataclass
class Runner:
    """Delivers frames to one machine, keyed by rollout, and fires the timers that are due."""

    emit_at_once: bool = False
    defer_early_deadlines: bool = False
    clock: int = NOW
    watermark: int = 0
    counts: Counter[Count] = field(default_factory=Counter)
    stores: dict[str, MemoryStore] = field(default_factory=dict)
    log: list[tuple[str, Record | None, int]] = field(default_factory=list)  # delivered, at
    out: list[tuple[int, Outcome]] = field(default_factory=list)  # (deliveries before it, it)
    deadline_sets_on_arrival: Counter[str] = field(default_factory=Counter)
    policy: RewardPolicy = field(default_factory=RewardPolicy)

    def __post_init__(self) -> None:
        self.machine = RolloutMachine(
            LATENESS,
            self.defer_early_deadlines,
            self.emit_at_once,
            lambda what, n: self.counts.update({what: n}),
            lambda: self.clock,
            self.policy,
        )

    def deliver(
        self, rollout_id: str, record: Record | None, at_us: int, frame: bytes = b""
    ) -> None:
        store = self.stores.setdefault(rollout_id, MemoryStore())
        sets = store.deadline_sets
        self.log.append((rollout_id, record, at_us))
        frame = frame or encode_message([record])  # type: ignore[list-item]
        self._keep(self.machine.on_frame(store, rollout_id, frame, at_us))
        self.deadline_sets_on_arrival[rollout_id] += store.deadline_sets - sets
        self._fire()  # a timer set where the watermark already is fires at once

    def advance(self, to_us: int, rounds: int = 5) -> None:
        self.watermark = max(self.watermark, to_us)
        for _ in range(rounds):  # a timer that moves itself fires again in a later round
            if not self._fire():
                return

    def _fire(self) -> bool:
        due = sorted(
            (at, kind, key)
            for key, store in self.stores.items()
            for kind, at in store.timers.items()
            if at <= self.watermark
        )
        for at, kind, key in due:
            store = self.stores[key]
            if store.timers.get(kind) != at:
                continue  # set again meanwhile
            del store.timers[kind]
            if kind == "deadline":
                self._keep(self.machine.on_deadline(store, key, at))
            else:
                self._keep(self.machine.on_settle(store, key))
        return bool(due)

    def _keep(self, outcomes: list[Outcome]) -> None:
        self.out += [(len(self.log), o) for o in outcomes]

    def main(self) -> list[tuple[int, Outcome]]:
        return [(i, o) for i, o in self.out if not o.dead]

    def dead(self) -> list[tuple[int, Outcome]]:
        return [(i, o) for i, o in self.out if o.dead]

    def records(self, rollout_id: str, upto: int | None = None) -> list[Record]:
        return [r for k, r, _ in self.log[:upto] if k == rollout_id and r is not None]
