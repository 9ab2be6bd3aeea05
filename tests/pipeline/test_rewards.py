"""Rewards from several sources and times (pipeline.rewards): the training reward the policy
makes of them, and, in the per-rollout state machine, an episode that waits for its required
rewards, is trained with what it has or dead-lettered at its deadline, and never takes a reward
twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openforge.testing.rollouts import make_rollout
from pipeline.assembly import reward_order
from pipeline.rewards import MissingRewards, RewardPolicy, named_values
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
from tests.pipeline.state_runner import LATENESS, START, Runner

NAMES = st.sampled_from(["tests", "thumbs", "ci", "judge"])
VALUES = st.floats(-10, 10, allow_nan=False)
REWARD = st.builds(
    lambda i, at, value, parts, source: RewardEvent(
        f"rw-{i}", "r", value, at, components=parts, verifier=source
    ),
    st.integers(0, 10**6),
    st.integers(1, 10**9),
    VALUES,
    st.dictionaries(NAMES, VALUES, max_size=3),
    st.one_of(st.none(), st.sampled_from(["unit", "feedback"])),
)


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(REWARD, max_size=5, unique_by=lambda r: r.event_id),
    weights=st.dictionaries(
        st.sampled_from(["tests", "thumbs", "unit", "feedback", "reward"]), VALUES, max_size=4
    ),
)
def test_the_training_reward_is_the_weighted_newest_value_of_each_name(
    rewards: list[RewardEvent], weights: dict[str, float]
) -> None:
    ordered = sorted(rewards, key=reward_order)
    value, components = RewardPolicy(weights).reward(ordered)
    if not ordered:
        assert (value, components) == (None, {})
        return
    if not weights:  # as before: the newest event's scalar
        assert value == ordered[-1].reward and components == ordered[-1].components
        return
    newest: dict[str, float] = {}
    for r in ordered:
        newest.update(named_values(r))
    assert components == newest
    assert value == pytest.approx(sum(w * newest[n] for n, w in weights.items() if n in newest))


def _feedback(value: float, at: int) -> RewardEvent:
    return RewardEvent(
        "r-thumbs", "r", value, at, components={"thumbs": value}, verifier="feedback"
    )


POLICY = RewardPolicy({"tests": 1.0, "thumbs": 0.5}, required=("tests", "thumbs"))


@pytest.mark.parametrize("emit_at_once", [False, True])
def test_an_episode_waits_for_its_required_rewards_and_combines_them(emit_at_once: bool) -> None:
    rollout = make_rollout(3, "r", calls=3)  # finished, with the verifier's reward "tests"
    runner = Runner(emit_at_once=emit_at_once, policy=POLICY)
    at = START
    for record in rollout.records:
        at += 1000
        runner.deliver("r", record, at)
    runner.advance(at + 10_000)
    assert runner.out == []  # finished and scored, but the person has not answered yet
    runner.deliver("r", _feedback(1.0, at + 20_000), at + 20_000)
    runner.advance(at + 30_000)
    [(_, outcome)] = runner.out
    assert not outcome.dead
    assert outcome.episode.reward == pytest.approx(rollout.reward * 1.0 + 1.0 * 0.5)
    assert outcome.episode.reward_components["thumbs"] == 1.0
    # Feedback after the episode went out is counted late and dead-lettered, never applied.
    runner.deliver("r", _feedback(0.0, at + 40_000), at + 40_000)
    assert [o.dead for _, o in runner.out] == [False, True]
    assert runner.out[-1][1].episode.dead_letter == "reward arrived after the episode was emitted"


@pytest.mark.parametrize("on_missing", list(MissingRewards))
def test_at_the_deadline_a_missing_required_reward_trains_with_what_it_has_or_dead_letters(
    on_missing: MissingRewards,
) -> None:
    policy = RewardPolicy(POLICY.weights, POLICY.required, on_missing)
    rollout = make_rollout(4, "r", calls=2)
    runner = Runner(policy=policy)
    at = START
    for record in rollout.records:
        at += 1000
        runner.deliver("r", record, at)
    runner.advance(at + 3 * LATENESS)
    [(_, outcome)] = runner.out
    if on_missing is MissingRewards.TRAIN:
        assert not outcome.dead and outcome.episode.reward == pytest.approx(rollout.reward)
    else:
        assert outcome.dead
        assert outcome.episode.dead_letter == "required rewards missing by the deadline: thumbs"


def test_options_are_checked_when_the_policy_is_built() -> None:
    policy = RewardPolicy.of_options(["tests=1", "thumbs=0.5"], ["tests"], "train")
    assert policy.weights == {"tests": 1.0, "thumbs": 0.5}
    assert policy.required == ("tests",) and policy.on_missing is MissingRewards.TRAIN
    for bad in (["tests"], ["tests=x"], ["=1"]):
        with pytest.raises(ConfigError, match="NAME=WEIGHT"):
            RewardPolicy.of_options(bad, [], "dead_letter")
    with pytest.raises(ConfigError, match="on_missing"):
        RewardPolicy.of_options([], [], "drop")


def test_rules_over_the_rollouts_own_records_weigh_in_where_the_policy_names_them() -> None:
    """``rule:exit_ok`` from the agent's end and ``rule:call_errors`` from its calls' statuses
    join the training reward when weighted, and never hold an episode back when required."""
    from pipeline.assembly import assemble

    rollout = make_rollout(5, "r", calls=3)  # finished with exit code 0; some calls may fail
    policy = RewardPolicy(
        {"tests": 1.0, "rule:exit_ok": 0.25, "rule:call_errors": -1.0},
        required=("tests", "rule:exit_ok"),
    )
    episode = assemble("r", rollout.records, created_us=0, policy=policy)
    calls = [r for r in rollout.records if isinstance(r, CompletionEvent) and not r.side_call]
    unique = {c.event_id: c for c in calls}.values()
    errors = sum(c.status is not CompletionStatus.OK for c in unique) / len(unique)
    assert episode.reward_components["rule:exit_ok"] == 1.0
    assert episode.reward_components["rule:call_errors"] == pytest.approx(errors)
    assert episode.reward == pytest.approx(rollout.reward + 0.25 - errors)
    assert policy.complete({"tests", "reward"}, any_reward=True)  # rule names not awaited
    plain = assemble("r", rollout.records, created_us=0)
    assert "rule:exit_ok" not in plain.reward_components  # not named: not recorded
