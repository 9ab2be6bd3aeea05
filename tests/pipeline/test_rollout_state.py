"""The per-rollout state machine on its own, without Beam: any order of a rollout's events,
duplicates, rewards before and after its end, late rewards after it settled, its deadline, an
infrastructure failure and damaged frames. What it emits must be what ``pipeline.assembly``
builds from the same events.

The runner (``tests.pipeline.state_runner``) keeps the state in memory and moves an honest
watermark: never past an event still to be delivered.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openforge.testing.rollouts import make_rollout
from pipeline.arrival import Arrival
from pipeline.assembly import assemble, assemble_dead_letter
from pipeline.rollout_state import Count, Flags, IllegalTransition, Status
from schemas.codec import Record, encode_message
from schemas.completion import CompletionEvent
from schemas.enums import RolloutPhase
from schemas.episode import SUPERSEDED, episode_id_for
from schemas.reward import RewardEvent
from schemas.rollout import DEADLINE_S, RETRIED, RolloutEvent
from tests.pipeline.state_runner import LATENESS, NOW, START, Runner

EMITTED_LATE = "reward arrived after the episode was emitted"


@dataclass(frozen=True)
class Delivery:
    record: Record
    at_us: int


def _timed(records: list[Record], gaps: list[int]) -> list[Delivery]:
    """The records at event times in their order, each ``gap`` after the one before."""
    at, out = START, []
    for record, gap in zip(records, gaps, strict=True):
        at += gap
        out.append(Delivery(record, at))
    return out


def _play(runner: Runner, rollout_id: str, order: list[Delivery], advance: list[bool]) -> None:
    """Deliver in ``order``; where ``advance`` says, move the watermark as far as it may go
    (to the earliest event still to come); at the end, past every deadline."""
    for i, delivery in enumerate(order):
        runner.deliver(rollout_id, delivery.record, delivery.at_us)
        rest = order[i + 1 :]
        if advance[i] and rest:
            runner.advance(min(d.at_us for d in rest))
    runner.advance(max(d.at_us for d in order) + 3 * LATENESS)


SEEDS = st.integers(0, 20_000)  # make_rollout's token ids fit the schema's int32
GAPS = st.sampled_from([0, 1000, LATENESS // 2, LATENESS - 1])  # always under the lateness


@st.composite
def deliveries(draw: st.DrawFn, records: list[Record]) -> tuple[list[Delivery], list[bool]]:
    """The records timed (gaps under the lateness) plus a few redeliveries of them, in any
    order, and where the watermark moves."""
    timed = _timed(records, draw(st.lists(GAPS, min_size=len(records), max_size=len(records))))
    again = draw(st.lists(st.tuples(st.sampled_from(timed), GAPS), max_size=4))
    order = draw(st.permutations(timed + [Delivery(d.record, d.at_us + g) for d, g in again]))
    return order, draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)))


@settings(max_examples=200, deadline=None)
@given(
    seed=SEEDS,
    calls=st.integers(1, 8),
    emit_at_once=st.booleans(),
    data=st.data(),
)
def test_any_order_and_duplicates_settle_into_the_assembled_episode(
    seed: int, calls: int, emit_at_once: bool, data: st.DataObject
) -> None:
    """A finished, rewarded rollout, its events in any order (rewards before or after its end),
    with duplicates and maybe a re-score anywhere in event time: exactly one episode, what
    assembly builds from the events that arrived before it (with the watermark: every event
    after it is later in event time than all of them); each record after it is late, and a
    reward among them is dead-lettered. The flags cell is written a few times, the deadline set
    once."""
    records = list(make_rollout(seed, "r", calls=calls).records)
    if data.draw(st.booleans()):
        rescore = RewardEvent("r-rescore", "r", 0.25, START, verifier_version=1)
        records.insert(data.draw(st.integers(0, len(records))), rescore)
    order, advance = data.draw(deliveries(records))
    runner = Runner(emit_at_once=emit_at_once)
    _play(runner, "r", order, advance)

    [(at, episode)] = runner.main()
    assert episode.episode == assemble("r", runner.records("r", at), created_us=NOW)
    if not emit_at_once:  # it waited for the watermark to pass its events
        latest = max(at_us for _, _, at_us in runner.log[:at])
        assert all(at_us > latest for _, _, at_us in runner.log[at:])
    after = runner.records("r")[at:]
    assert [o.episode for _, o in runner.dead()] == [
        assemble_dead_letter("r", [r], NOW, EMITTED_LATE)
        for r in after
        if isinstance(r, RewardEvent)
    ]
    assert runner.counts[Count.LATE] == len(after)
    assert runner.counts[Count.EVENTS_READ] == len(order)
    store = runner.stores["r"]
    assert store.flags().status is Status.EMITTED and store.bag == []
    assert store.flag_writes <= 4  # began, finished, rewarded, emitted: each once at most
    assert runner.deadline_sets_on_arrival["r"] == 1


@settings(max_examples=60, deadline=None)
@given(
    seed=SEEDS,
    calls=st.integers(0, 6),
    rewarded=st.booleans(),
    emit_at_once=st.booleans(),
    data=st.data(),
)
def test_at_its_deadline_a_rollout_is_emitted_if_rewarded_else_dead_lettered(
    seed: int, calls: int, rewarded: bool, emit_at_once: bool, data: st.DataObject
) -> None:
    """A rollout that never reported its end, or never got its reward: at its deadline, one
    episode if it is rewarded (its end never came), else one dead letter saying why, holding
    everything that arrived; however many times its deadline moved on the way."""
    finished = not rewarded and data.draw(st.booleans())
    rollout = make_rollout(seed, "r", calls=calls, with_reward=rewarded, finished=finished)
    order, advance = data.draw(deliveries(rollout.records))
    runner = Runner(emit_at_once=emit_at_once)
    _play(runner, "r", order, advance)

    if rewarded:
        assert [o.episode for _, o in runner.out] == [
            assemble("r", rollout.records, created_us=NOW)
        ]
        assert runner.stores["r"].flags().status is Status.EMITTED
        return
    reason = "no reward by the deadline" + (
        "" if finished else "; the rollout never reported its end"
    )
    assert runner.main() == []
    assert [o.episode for _, o in runner.dead()] == [
        assemble_dead_letter("r", runner.records("r"), NOW, reason)
    ]
    assert runner.stores["r"].flags().status is Status.CLOSED  # its frames kept: it may reopen
    assert runner.deadline_sets_on_arrival["r"] == (1 if order else 0)


@settings(max_examples=60, deadline=None)
@given(
    seed=SEEDS,
    calls=st.integers(1, 6),
    late_by=st.sampled_from([-LATENESS, 0, 1, LATENESS]),
    emit_at_once=st.booleans(),
)
def test_a_reward_after_the_deadline_is_a_dead_letter_and_one_in_time_reopens(
    seed: int, calls: int, late_by: int, emit_at_once: bool
) -> None:
    """A finished rollout dead-lettered at its deadline, then its reward: later than the
    deadline in event time, a dead letter of its own; in time (delivered after the deadline
    fired, as a runner that fires timers early can do), the rollout reopens and its episode,
    the same episode id as the dead letter, supersedes it."""
    rollout = make_rollout(seed, "r", calls=calls, with_reward=False)
    timed = _timed(rollout.records, [1000] * len(rollout.records))
    runner = Runner(emit_at_once=emit_at_once)
    _play(runner, "r", timed, [True] * len(timed))
    [(_, closed)] = runner.dead()
    reward = RewardEvent("r-reward", "r", 0.5, START, components={"tests": 0.5})
    deadline = timed[-1].at_us + LATENESS
    runner.deliver("r", reward, deadline + late_by)
    runner.advance(deadline + late_by + 3 * LATENESS)

    if late_by > 0:
        reason = "reward arrived after the rollout's deadline"
        assert [o.episode for _, o in runner.dead()[1:]] == [
            assemble_dead_letter("r", [reward], NOW, reason)
        ]
        assert runner.main() == [] and runner.counts[Count.LATE] == 1
        return
    [(_, episode)] = runner.main()
    assert episode.episode == assemble("r", [*rollout.records, reward], created_us=NOW)
    assert episode.episode.episode_id == closed.episode.episode_id == episode_id_for("r")
    assert runner.counts[Count.REOPENED] == 1 and len(runner.dead()) == 1
    assert runner.deadline_sets_on_arrival["r"] == 2  # once when it began, once when reopened


@settings(max_examples=60, deadline=None)
@given(
    seed=SEEDS,
    calls=st.integers(1, 6),
    silent=st.sampled_from([2, 5, 30]),
    allowed=st.booleans(),
    started_first=st.booleans(),
    emit_at_once=st.booleans(),
)
def test_a_rollout_silent_past_its_lateness_is_rewarded_within_its_started_deadline(
    seed: int, calls: int, silent: int, allowed: bool, started_first: bool, emit_at_once: bool
) -> None:
    """A harness says nothing for several times the lateness (a long test run, a slow start),
    then ends and is rewarded: with its ``started`` event allowing it that long
    (``DEADLINE_S``), one episode, wherever the ``started`` event came in the order; without,
    its deadline dead-letters it and the reward is late."""
    rollout = make_rollout(seed, "r", calls=calls, with_reward=True)
    first, *calls_, end, reward = rollout.records
    assert isinstance(first, RolloutEvent) and first.phase is RolloutPhase.STARTED
    budget_s = silent * LATENESS / 1_000_000 + 1
    started = replace(first, metadata={DEADLINE_S: f"{budget_s:g}"}) if allowed else first
    timed = _timed([started, *calls_], [0] + [1000] * len(calls_))
    quiet = timed[-1].at_us + silent * LATENESS
    timed += [Delivery(end, quiet), Delivery(reward, quiet + 1000)]
    order = timed if started_first else [*timed[1:-2], timed[0], *timed[-2:]]
    runner = Runner(emit_at_once=emit_at_once)
    _play(runner, "r", order, [True] * len(order))

    if allowed:
        records = [started, *calls_, end, reward]
        assert [o.episode for _, o in runner.out] == [assemble("r", records, created_us=NOW)]
        return
    assert runner.main() == [] and runner.counts[Count.LATE] >= 1
    assert [o.episode.dead_letter for _, o in runner.dead()][-1] == (
        "reward arrived after the rollout's deadline"
    )


def test_a_deadline_that_is_not_a_number_of_seconds_is_ignored() -> None:
    start = RolloutEvent("s", "r", RolloutPhase.STARTED, START)
    for value, hold in [("90", START + 90_000_000), ("1e9", 0), ("nan", 0), ("soon", 0)]:
        frame = encode_message([replace(start, metadata={DEADLINE_S: value})])
        assert Arrival.of(frame).hold_until_us() == hold, value


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, calls=st.integers(1, 6), data=st.data())
def test_an_infrastructure_failure_dead_letters_the_rollout_at_once(
    seed: int, calls: int, data: st.DataObject
) -> None:
    """An infrastructure failure anywhere before a rollout's last event: one dead letter at once,
    with what arrived until then (superseded when a new attempt plays it again); every record
    after it is late, a reward among them is a dead letter of its own, and no episode ever
    comes."""
    rollout = make_rollout(seed, "r", calls=calls)
    retried = data.draw(st.booleans())  # a new attempt plays its sample again, or none does
    metadata = {RETRIED: "true"} if retried else {}
    failure = RolloutEvent(
        "r-infra", "r", RolloutPhase.INFRA_FAILED, 0, message="no sandbox", metadata=metadata
    )
    records = list(rollout.records)
    records.insert(data.draw(st.integers(0, len(records) - 1)), failure)  # before it settles
    timed = _timed(records, [1000] * len(records))
    runner = Runner(emit_at_once=data.draw(st.booleans()))
    _play(runner, "r", timed, [True] * len(timed))

    assert runner.main() == []
    (at, first), *rest = runner.dead()
    assert runner.log[at - 1][1] == failure
    reason = f"{SUPERSEDED if retried else 'infrastructure failure'}: no sandbox"
    assert first.episode == assemble_dead_letter("r", runner.records("r", at), NOW, reason)
    after = runner.records("r")[at:]
    assert [o.episode for _, o in rest] == [
        assemble_dead_letter("r", [r], NOW, EMITTED_LATE)
        for r in after
        if isinstance(r, RewardEvent)
    ]
    assert runner.counts[Count.LATE] == len(after)


@settings(max_examples=40, deadline=None)
@given(
    seed=SEEDS,
    calls=st.integers(1, 6),
    damage=st.sampled_from(["garbage", "header", "truncated completion"]),
    data=st.data(),
)
def test_a_damaged_frame_dead_letters_only_its_own_rollout(
    seed: int, calls: int, damage: str, data: st.DataObject
) -> None:
    """A frame that cannot be decoded, anywhere among a rollout's events (in event time before
    its end), dead-letters that rollout with the reason and is counted once; another rollout
    through the same machine still gets its episode."""
    bad_rollout = make_rollout(seed, "bad", calls=calls)
    fine = make_rollout(seed + 1, "fine", calls=calls)
    completion = next(r for r in bad_rollout.records if isinstance(r, CompletionEvent))
    whole = encode_message([completion])
    frame = {
        "garbage": b"\x00not a frame",
        "header": b"OF\x09" + whole[3:],  # a frame version this reader does not know
        "truncated completion": whole[: len(whole) - 8],  # metadata whole: peeked, not decoded
    }[damage]
    timed = _timed(bad_rollout.records, [1000] * len(bad_rollout.records))
    position = data.draw(st.integers(0, len(timed) - 1))
    runner = Runner(emit_at_once=data.draw(st.booleans()))
    for i, delivery in enumerate(timed):
        if i == position:
            runner.deliver("bad", None, delivery.at_us, frame=frame)
        runner.deliver("bad", delivery.record, delivery.at_us)
    _play(runner, "fine", _timed(fine.records, [1000] * len(fine.records)), [False] * 99)

    assert [o.episode for _, o in runner.main()] == [assemble("fine", fine.records, created_us=NOW)]
    [(_, dead)] = runner.dead()
    assert dead.episode.rollout_id == "bad"
    assert (dead.episode.dead_letter or "").startswith("a frame of it cannot be decoded: ")
    assert set(dead.episode.lineage) == {r.event_id for r in bad_rollout.records}  # type: ignore[union-attr]
    assert runner.counts[Count.UNDECODABLE] == 1


def test_a_deadline_fired_before_its_time_by_the_wall_clock_is_deferred() -> None:
    """With ``defer_early_deadlines``, a deadline that fires while the wall clock is before it
    is re-armed and counted; it decides once the clock has passed it."""
    rollout = make_rollout(3, "r", calls=3, with_reward=False)
    timed = _timed(rollout.records, [1000] * len(rollout.records))
    runner = Runner(defer_early_deadlines=True, clock=START)
    for delivery in timed:
        runner.deliver("r", delivery.record, delivery.at_us)
    runner.advance(timed[-1].at_us + 2 * LATENESS)
    assert runner.out == [] and runner.counts[Count.EARLY] >= 1
    assert runner.stores["r"].flags() == Flags(Status.OPEN, finished=True, began=True)
    runner.clock = NOW
    runner.advance(timed[-1].at_us + 2 * LATENESS)
    [(_, dead)] = runner.dead()
    assert dead.episode.dead_letter == "no reward by the deadline"


def test_a_completion_frame_is_peeked_on_arrival_and_others_decoded() -> None:
    """On arrival a completion frame is only peeked at (its count); a reward or lifecycle frame
    is decoded (it decides the flags); a damaged frame is neither."""
    rollout = make_rollout(5, "r", calls=2)
    completion = next(r for r in rollout.records if isinstance(r, CompletionEvent))
    reward = next(r for r in rollout.records if isinstance(r, RewardEvent))
    assert Arrival.of(encode_message([completion, completion])) == (CompletionEvent, 2, [])
    assert Arrival.of(encode_message([reward])) == (RewardEvent, 1, [reward])
    assert Arrival.of(b"not a frame") == (None, 0, [])


def test_only_the_lifecycle_transitions_are_allowed() -> None:
    """OPEN -> EMITTED, OPEN -> CLOSED, CLOSED -> OPEN; nothing leaves EMITTED."""
    allowed = {(Status.OPEN, Status.EMITTED), (Status.OPEN, Status.CLOSED)}
    allowed.add((Status.CLOSED, Status.OPEN))
    for start in Status:
        for end in Status:
            if (start, end) in allowed:
                assert Flags(start).to(end) == Flags(end)
            else:
                with pytest.raises(IllegalTransition):
                    Flags(start).to(end)


def test_the_state_machine_imports_no_beam() -> None:
    """The pure core stays apart from its framework shell (``pipeline.assemble``)."""
    code = (
        "import sys, pipeline.rollout_state; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
