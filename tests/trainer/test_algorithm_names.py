"""The algorithm enums hold veRL's names, exactly those this trainer computes: every member runs on
a small batch the way the backends call it, and every veRL name left out fails there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

from trainer.algorithm_names import AdvantageEstimator, PolicyLoss
from trainer.algorithms import AlgorithmConfig, actor_config, compute_advantages, policy_loss

MASK = torch.tensor([[1.0, 1.0, 0.0]] * 4)
INDEX = np.array(["a", "a", "b", "b"])
OLD = torch.tensor([[-1.0, -2.0, -3.0]] * 4)


def _rewards() -> torch.Tensor:
    rewards = torch.zeros(4, 3)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.5, 0.0])  # outcome reward on the last token
    return rewards


@pytest.mark.parametrize("name", list(AdvantageEstimator))
def test_every_advantage_estimator_runs(name: AdvantageEstimator) -> None:
    adv = compute_advantages(AlgorithmConfig(advantage=name), _rewards(), MASK, INDEX)
    assert adv.shape == (4, 3) and bool(torch.isfinite(adv).all())
    assert bool((adv[:, 2] == 0).all())  # masked


@pytest.mark.parametrize("name", list(PolicyLoss))
def test_every_policy_loss_runs(name: PolicyLoss) -> None:
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3, [0.5] * 3, [-0.5] * 3])
    loss, metrics = policy_loss(AlgorithmConfig(policy_loss=name), OLD, OLD + 0.1, adv, MASK)
    assert loss.dim() == 0 and bool(torch.isfinite(loss)) and isinstance(metrics, dict)


def test_the_advantage_estimators_left_out_cannot_run_as_the_trainer_calls_them() -> None:
    registry = set(core_algos.ADV_ESTIMATOR_REGISTRY)
    assert {m.value for m in AdvantageEstimator} <= registry
    left_out = registry - {m.value for m in AdvantageEstimator}
    assert left_out == {
        "gae",
        "remax",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
        "reinforce_plus_plus",
        "grpo_passk",
    }
    for name in sorted(left_out):  # called as trainer.algorithms.compute_advantages calls them
        fn = core_algos.get_adv_estimator_fn(name)
        with pytest.raises((TypeError, AssertionError)):
            fn(token_level_rewards=_rewards(), response_mask=MASK, index=INDEX)


def test_the_policy_losses_left_out_cannot_run_with_our_actor_config() -> None:
    registry = set(core_algos.POLICY_LOSS_REGISTRY)
    assert {m.value for m in PolicyLoss} <= registry
    left_out = registry - {m.value for m in PolicyLoss}
    assert left_out == {"dro"}
    base = actor_config(AlgorithmConfig())
    for name in sorted(left_out):  # called as trainer.algorithms.policy_loss calls them
        config = dataclasses.replace(
            base, policy_loss=dataclasses.replace(base.policy_loss, loss_mode=name)
        )
        with pytest.raises(ValueError, match="dro_beta"):
            core_algos.get_policy_loss_fn(name)(
                old_log_prob=OLD,
                log_prob=OLD + 0.1,
                advantages=torch.ones(4, 3),
                response_mask=MASK,
                loss_agg_mode="token-mean",
                config=config,
                rollout_is_weights=None,
            )
