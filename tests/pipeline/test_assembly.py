"""Episode assembly: shuffled, duplicated events of random rollouts rebuild the known samples."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from openforge.testing.rollouts import make_rollout
from pipeline.assembly import assemble, assemble_dead_letter, missing_events
from schemas.completion import CompletionEvent
from schemas.enums import ContinuityClass
from schemas.episode import episode_id_for
from schemas.errors import SchemaError


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), calls=st.integers(1, 14), shuffle=st.integers(0, 10**6))
def test_shuffled_events_reassemble_into_the_original_samples(
    seed: int, calls: int, shuffle: int
) -> None:
    rollout = make_rollout(seed, calls=calls)
    records = list(rollout.records)
    random.Random(shuffle).shuffle(records)
    episode = assemble(rollout.rollout_id, records, created_us=0)

    assert episode.episode_id == episode_id_for(rollout.rollout_id)
    assert episode.reward == rollout.reward and episode.task_id == "task"
    assert [s.token_ids for s in episode.samples] == [s.tokens for s in rollout.samples]
    assert [s.loss_mask for s in episode.samples] == [s.mask for s in rollout.samples]
    assert [s.behavior_logprobs for s in episode.samples] == [s.logprobs for s in rollout.samples]
    assert [s.parent_index for s in episode.samples] == [s.parent for s in rollout.samples]
    for sample in episode.samples:
        # Policy spans cover exactly the generated tokens.
        covered = {p for span in sample.policy_versions for p in range(span.start, span.end)}
        assert covered == {i for i, m in enumerate(sample.loss_mask) if m == 1}
    assert len(episode.forks) == len(episode.samples)
    assert all(f.mismatch is not ContinuityClass.EXACT for f in episode.forks)
    assert len(episode.lineage) == len(set(episode.lineage))  # duplicates collapsed


def test_nothing_to_train_on_is_an_empty_episode() -> None:
    rollout = make_rollout(1, calls=0)
    episode = assemble("r", rollout.records, created_us=0)
    assert episode.samples == [] and episode.reward == rollout.reward


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), calls=st.integers(1, 10), drop=st.integers(0, 10**6))
def test_a_rollout_with_no_missing_events_assembles_and_a_dead_letter_never_fails(
    seed: int, calls: int, drop: int
) -> None:
    """``missing_events`` names exactly what blocks assembly: with none missing, assembly
    succeeds; with some, the dead-letter episode still builds and keeps every event id."""
    rollout = make_rollout(seed, calls=calls)
    assert missing_events(rollout.records) == []
    rng = random.Random(drop)
    kept = [r for r in rollout.records if not isinstance(r, CompletionEvent) or rng.random() < 0.7]
    missing = missing_events(kept)
    try:
        assemble(rollout.rollout_id, kept, created_us=0)
        assembled = True
    except SchemaError:
        assembled = False
    assert assembled or missing  # nothing missing: it assembles
    dead = assemble_dead_letter(rollout.rollout_id, kept, 0, "why")
    assert dead.dead_letter is not None and dead.dead_letter.startswith("why")
    assert set(dead.lineage) == {r.event_id for r in kept}


def test_the_reward_join_prefers_the_newest_verifier_version_in_any_order() -> None:
    from schemas.reward import RewardEvent

    rollout = make_rollout(7, calls=3)
    original = next(r for r in rollout.records if isinstance(r, RewardEvent))
    v1 = RewardEvent("rw-v1", rollout.rollout_id, 0.25, original.at_us + 10, verifier_version=1)
    v2 = RewardEvent("rw-v2", rollout.rollout_id, 0.5, original.at_us + 5, verifier_version=2)
    # A reward without a version recorded after the re-scores (an older writer) still loses.
    late = RewardEvent("rw-late", rollout.rollout_id, 0.75, original.at_us + 20)
    for order in ([v2, v1, late], [late, v1, v2]):
        episode = assemble(rollout.rollout_id, [*rollout.records, *order], created_us=0)
        assert episode.reward == 0.5
