"""veRL's losses and corrections on fixed batches, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from schemas.errors import ConfigError
from trainer.algorithms import (
    AlgorithmConfig,
    compute_advantages,
    policy_loss,
    rollout_correction,
)

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_grpo_advantages_are_group_normalised_rewards() -> None:
    rewards = torch.zeros(4, 3)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.5, 0.5])  # outcome reward on the last token
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    adv = compute_advantages(AlgorithmConfig(), rewards, mask, np.array(["a", "a", "b", "b"]))
    # Group a: rewards (1, 0): mean 0.5, std 0.7071 -> +-0.7071; group b: equal -> 0.
    expected = [1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0]
    for row, value in enumerate(expected):
        assert adv[row, 0].item() == pytest.approx(value, abs=1e-4)
        assert adv[row, 2].item() == 0.0  # masked


def test_ppo_clip_loss_equals_a_hand_computation() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    new = torch.tensor([[-0.5, -2.0, -9.0], [-1.5, -1.0, -0.1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, metrics = policy_loss(AlgorithmConfig(clip_ratio=0.2), old, new, adv, MASK)
    # ratio = exp(new - old); per token: max(-A*r, -A*clip(r, 0.8, 1.2)); token mean over mask.
    hand = []
    for i in range(2):
        for j in range(3):
            if MASK[i, j] == 0:
                continue
            r = math.exp(new[i, j] - old[i, j])
            a = adv[i, j].item()
            per = max(-a * r, -a * min(max(r, 0.8), 1.2))
            if a < 0:
                per = min(per, -a * 3.0)  # dual clip
            hand.append(per)
    assert loss.item() == pytest.approx(sum(hand) / len(hand), rel=1e-6)
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0


def test_on_policy_correction_changes_nothing() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.2]])
    adv = torch.tensor([[0.3, 0.3, 0.3], [-0.6, -0.6, -0.6]])
    weights, mask, _ = rollout_correction(AlgorithmConfig(), logp, logp.clone(), MASK)
    assert weights is not None and torch.allclose(weights * MASK, MASK)
    corrected, _ = policy_loss(AlgorithmConfig(), logp, logp, adv, mask, weights)
    plain, _ = policy_loss(AlgorithmConfig(), logp, logp, adv, MASK)
    assert corrected.item() == pytest.approx(plain.item(), abs=1e-7)


def test_is_weights_are_exp_delta_truncated_at_the_threshold() -> None:
    trainer = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    shift = torch.tensor([[0.5, -0.3, 0.0], [1.5, -2.0, 0.1]])  # trainer - behavior
    behavior = trainer - shift
    weights, _, metrics = rollout_correction(
        AlgorithmConfig(rollout_is_threshold=2.0), trainer, behavior, MASK
    )
    assert weights is not None
    expected = torch.clamp(torch.exp(shift), max=2.0) * MASK
    assert torch.allclose(weights * MASK, expected, atol=1e-6)
    assert any(k.startswith("rollout_corr/") for k in metrics)


def test_bad_names_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="grpo"):
        compute_advantages(
            AlgorithmConfig(advantage="nope"), torch.zeros(1, 1), torch.ones(1, 1), np.array(["a"])
        )
    with pytest.raises(ConfigError, match="vanilla"):
        policy_loss(
            AlgorithmConfig(policy_loss="nope"),
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
        )
