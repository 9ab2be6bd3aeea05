"""AssembleEpisodes on scripted streams (TestStream, BundleBasedDirectRunner): out-of-order
calls, late and early rewards, duplicates, retries, forks, missing rewards."""

from __future__ import annotations

import random
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue

from openforge.testing.rollouts import Rollout, make_rollout
from pipeline.assemble import DEAD_LETTER, AssembleEpisodes
from schemas.codec import Record, encode_message
from schemas.completion import CompletionEvent
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

LATENESS = 100.0  # seconds of event time


def _pipeline() -> BeamTestPipeline:
    options = PipelineOptions(runner="BundleBasedDirectRunner")
    options.view_as(StandardOptions).streaming = True
    return BeamTestPipeline(options=options)


def _frames(records: list[Record], at: float) -> list[TimestampedValue]:
    return [TimestampedValue((r.rollout_id, encode_message([r])), at) for r in records]


def _summary(episode: Any) -> tuple[Any, ...]:
    return (
        episode.rollout_id,
        episode.reward,
        tuple(tuple(s.token_ids) for s in episode.samples),
        tuple(tuple(s.loss_mask) for s in episode.samples),
        episode.dead_letter,
    )


def _expected(rollout: Rollout, dead: str | None = None) -> tuple[Any, ...]:
    return (
        rollout.rollout_id,
        None if dead else rollout.reward,
        tuple(tuple(s.tokens) for s in rollout.samples),
        tuple(tuple(s.mask) for s in rollout.samples),
        dead,
    )


def _split(rollout: Rollout) -> tuple[list[Record], list[Record], list[Record]]:
    calls = [
        r
        for r in rollout.records
        if isinstance(r, CompletionEvent | RolloutEvent)
        and not (isinstance(r, RolloutEvent) and r.phase.value != "started")
    ]
    rewards = [r for r in rollout.records if isinstance(r, RewardEvent)]
    ends = [
        r for r in rollout.records if isinstance(r, RolloutEvent) and r.phase.value != "started"
    ]
    return calls, rewards, ends


def test_scripted_stream_covers_every_case() -> None:
    shuffled = make_rollout(1, "out-of-order", calls=10)  # with duplicates, retries, forks
    late = make_rollout(2, "late-reward", calls=4)
    early = make_rollout(3, "early-reward", calls=4)
    missing = make_rollout(4, "no-reward", calls=3, with_reward=False)
    unfinished = make_rollout(5, "never-finished", calls=3, finished=False)
    too_late = make_rollout(6, "too-late", calls=3, with_reward=False)
    assert any(len(r.samples) > 1 for r in (shuffled, late, early)), "a fork is scripted"

    calls, rewards, ends = _split(shuffled)
    calls = calls + [c for c in calls if isinstance(c, CompletionEvent)][:2]  # duplicates
    random.Random(0).shuffle(calls)
    l_calls, l_rewards, l_ends = _split(late)
    e_calls, e_rewards, e_ends = _split(early)
    m_calls, _, m_ends = _split(missing)
    u_calls, u_rewards, _ = _split(unfinished)
    t_calls, _, t_ends = _split(too_late)
    late_reward = RewardEvent("too-late-reward", "too-late", 0.9, 0)

    stream = (
        ScriptedStream()
        .advance_watermark_to(0)
        .add_elements(_frames(e_rewards, 1))  # a reward before the first call
        .add_elements(_frames(calls + rewards + ends, 2))
        .add_elements(_frames(l_calls + l_ends + e_calls + m_calls + u_calls + t_calls, 3))
        .advance_watermark_to(50)
        .add_elements(_frames(l_rewards + e_ends + m_ends + t_ends, 60))  # late but in time
        .add_elements(_frames(u_rewards, 70))
        .advance_watermark_to(400)  # deadlines pass: dead letters and unfinished-but-rewarded
        .add_elements(_frames([late_reward], 401))  # after too-late's deadline
        .advance_watermark_to(1000)
    )
    with _pipeline() as p:
        out = p | stream | AssembleEpisodes(allowed_lateness_s=LATENESS)
        assert_that(
            out.episodes | "main" >> beam.Map(_summary),
            equal_to(
                [
                    _expected(shuffled),
                    _expected(late),
                    _expected(early),
                    _expected(unfinished),
                ]
            ),
            label="episodes",
        )
        assert_that(
            out[DEAD_LETTER] | "dead" >> beam.Map(_summary),
            equal_to(
                [
                    _expected(missing, dead="no reward by the deadline"),
                    _expected(too_late, dead="no reward by the deadline"),
                    ("too-late", 0.9, (), (), "reward arrived after the rollout's deadline"),
                ]
            ),
            label="dead letters",
        )


def test_an_infrastructure_failure_is_dead_lettered_at_once() -> None:
    """The orchestrator retries such a rollout under a new id; its own records never wait for a
    reward that will not come, and a record of it arriving later is not an episode."""
    from schemas.enums import RolloutPhase

    broken = make_rollout(7, "broken", calls=3, with_reward=False, finished=False)
    calls, _, _ = _split(broken)
    failed = RolloutEvent(
        "broken-infra", "broken", RolloutPhase.INFRA_FAILED, 0, message="sandbox did not start"
    )
    stream = (
        ScriptedStream()
        .advance_watermark_to(0)
        .add_elements(_frames(calls, 1))
        .add_elements(_frames([failed], 2))  # long before any deadline
        .add_elements(_frames([RewardEvent("stray", "broken", 1.0, 0)], 3))
        .advance_watermark_to(1000)
    )
    with _pipeline() as p:
        out = p | stream | AssembleEpisodes(allowed_lateness_s=LATENESS)
        assert_that(out.episodes | "main" >> beam.Map(_summary), equal_to([]), label="episodes")
        assert_that(
            out[DEAD_LETTER] | "dead" >> beam.Map(lambda e: (e.rollout_id, e.dead_letter)),
            equal_to(
                [
                    ("broken", "infrastructure failure: sandbox did not start"),
                    ("broken", "reward arrived after the episode was emitted"),
                ]
            ),
            label="dead letters",
        )


def test_a_rollout_waits_for_a_call_it_extends_and_poison_stops_only_its_rollout() -> None:
    """A split read can deliver a call after the watermark passed it: the episode waits for the
    call its successor extends. A frame that cannot be decoded, or a damaged event, dead-letters
    its own rollout with the reason; every other rollout still gets its episode."""
    import dataclasses

    gap = make_rollout(8, "gap", calls=4)
    calls, rewards, ends = _split(gap)
    held = next(
        r
        for r in calls
        if isinstance(r, CompletionEvent)
        and any(
            isinstance(o, CompletionEvent) and o.prompt_ref_event_id == r.event_id for o in calls
        )
    )
    poisoned = make_rollout(9, "poisoned", calls=3)
    damaged = make_rollout(10, "damaged", calls=3)
    d_calls, d_rewards, d_ends = _split(damaged)
    d_calls = [  # the first call claims a longer prompt than it carries
        dataclasses.replace(r, prompt_length=r.prompt_length + 5)
        if isinstance(r, CompletionEvent) and r.call_index == 0
        else r
        for r in d_calls
    ]
    fine = make_rollout(11, "fine", calls=3)
    stream = (
        ScriptedStream()
        .advance_watermark_to(0)
        .add_elements(_frames([c for c in calls if c is not held] + rewards + ends, 2))
        .add_elements([TimestampedValue(("poisoned", b"\x00not a frame"), 2)])
        .add_elements(_frames(poisoned.records + d_calls + d_rewards + d_ends, 2))
        .add_elements(_frames(fine.records, 3))
        .advance_watermark_to(20)  # past every event: "gap" settles without its held call
        .add_elements(_frames([held], 2))  # in time by event time (lateness 100 s)
        .advance_watermark_to(1000)
    )
    with _pipeline() as p:
        out = p | stream | AssembleEpisodes(allowed_lateness_s=LATENESS)
        assert_that(
            out.episodes | "main" >> beam.Map(_summary),
            equal_to([_expected(gap), _expected(fine)]),
            label="episodes",
        )
        assert_that(
            out[DEAD_LETTER]
            | "dead" >> beam.Map(lambda e: (e.rollout_id, (e.dead_letter or "").split(":")[0])),
            equal_to(
                [
                    ("poisoned", "a frame of it cannot be decoded"),
                    ("damaged", "cannot be assembled"),
                ]
            ),
            label="dead letters",
        )


def test_a_rollout_queued_longer_than_the_lateness_still_gets_its_episode() -> None:
    """The orchestrator records ``queued`` before a concurrency slot frees; the deadline runs
    from the rollout's first event after that, not from the queue."""
    from schemas.enums import RolloutPhase

    waited = make_rollout(12, "waited", calls=3)
    queued = RolloutEvent("waited-queued", "waited", RolloutPhase.QUEUED, 0, task_id="task")
    stream = (
        ScriptedStream()
        .advance_watermark_to(0)
        .add_elements(_frames([queued], 1))
        .advance_watermark_to(300)  # three times the lateness in the queue
        .add_elements(_frames(waited.records, 301))
        .advance_watermark_to(1000)
    )
    with _pipeline() as p:
        out = p | stream | AssembleEpisodes(allowed_lateness_s=LATENESS)
        assert_that(
            out.episodes | "main" >> beam.Map(_summary),
            equal_to([_expected(waited)]),
            label="episodes",
        )
        assert_that(out[DEAD_LETTER] | "dead" >> beam.Map(_summary), equal_to([]), label="dead")


def test_required_rewards_from_two_sources_are_awaited_and_combined_in_beam_state() -> None:
    """The verifier's score comes with the rollout's end, a person's thumbs up much later (in
    time): the episode waits for both (the reward names live in the flags cell) and its reward
    is their weighted sum; a second rollout whose thumbs never come is dead-lettered."""
    from pipeline.rewards import RewardPolicy

    policy = RewardPolicy({"tests": 1.0, "thumbs": 0.5}, required=("tests", "thumbs"))
    done, waiting = make_rollout(11, "done", calls=2), make_rollout(12, "waiting", calls=2)
    thumbs = RewardEvent("thumbs", "done", 1.0, 0, components={"thumbs": 1.0}, verifier="fb")
    stream = (
        ScriptedStream()
        .advance_watermark_to(0)
        .add_elements(_frames(done.records, 1) + _frames(waiting.records, 1))
        .advance_watermark_to(50)  # both finished and scored: neither may go out yet
        .add_elements(_frames([thumbs], 60))
        .advance_watermark_to(1000)
    )
    with _pipeline() as p:
        out = p | stream | AssembleEpisodes(allowed_lateness_s=LATENESS, policy=policy)
        assert_that(
            out.episodes | "main" >> beam.Map(lambda e: (e.rollout_id, e.reward)),
            equal_to([("done", done.reward + 0.5)]),
            label="episodes",
        )
        assert_that(
            out[DEAD_LETTER] | "dead" >> beam.Map(lambda e: (e.rollout_id, e.dead_letter)),
            equal_to([("waiting", "required rewards missing by the deadline: thumbs")]),
            label="dead letters",
        )
