"""veRL's algorithms, used as they are: advantage estimators, policy losses, rollout correction.

Shapes: ``[batch, response_len]`` for every per-token tensor; ``index`` is a ``[batch]`` array
of group ids (samples of one task, compared by GRPO/RLOO). The estimator and the loss are named
by the enums of ``trainer.algorithm_names`` (veRL's registry keys), checked when the config is
built: a bad name lists the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.workers.config.actor import FSDPActorConfig, PolicyLossConfig

from schemas.registry import choose
from trainer.algorithm_names import AdvantageEstimator, PolicyLoss


@dataclass(frozen=True)
class AlgorithmConfig:
    """Which of veRL's algorithms to use, and their knobs.

    Attributes:
        advantage: advantage estimator (:class:`AdvantageEstimator`): ``grpo`` (default),
            ``rloo``, ``reinforce_plus_plus_baseline``, ...
        policy_loss: policy loss (:class:`PolicyLoss`): ``vanilla`` (PPO clip), ``gspo``,
            ``cispo``, ...
        clip_ratio: PPO clip epsilon.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-sum``, ...
        rollout_is: off-policy correction weights: ``token`` (truncated IS, default),
            ``sequence``, or None.
        rollout_is_threshold: truncation of the IS weights.
        rollout_rs: rejection mask (``token``, ``sequence``, IcePop-style ``token_icepop``...)
            or None.
        rollout_rs_threshold: its threshold.
    """

    advantage: AdvantageEstimator = AdvantageEstimator.GRPO
    policy_loss: PolicyLoss = PolicyLoss.VANILLA
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    rollout_is: str | None = "token"
    rollout_is_threshold: float = 2.0
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None

    def __post_init__(self) -> None:
        advantage = choose(AdvantageEstimator, self.advantage, "advantage estimator")
        object.__setattr__(self, "advantage", advantage)
        object.__setattr__(self, "policy_loss", choose(PolicyLoss, self.policy_loss, "policy loss"))


def actor_config(cfg: AlgorithmConfig) -> FSDPActorConfig:
    """veRL's actor config carrying our algorithm choices (its losses read them from here)."""
    return FSDPActorConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        ppo_mini_batch_size=1,
        use_dynamic_bsz=False,
        rollout_n=1,
        clip_ratio=cfg.clip_ratio,
        loss_agg_mode=cfg.loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=cfg.policy_loss.value),
        entropy_coeff=0.0,
        use_kl_loss=False,
    )


def compute_advantages(
    cfg: AlgorithmConfig,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
) -> torch.Tensor:
    """Per-token advantages ``[batch, response_len]`` from outcome rewards."""
    fn = core_algos.get_adv_estimator_fn(cfg.advantage.value)
    advantages, _returns = fn(
        token_level_rewards=token_level_rewards, response_mask=response_mask, index=index
    )
    return torch.as_tensor(advantages)


def rollout_correction(
    cfg: AlgorithmConfig,
    trainer_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (None if disabled) and the rejection-adjusted mask, from the behavior logprobs
    the proxy recorded against the trainer's own recomputed logprobs."""
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=trainer_logprobs,
        rollout_log_prob=behavior_logprobs,
        response_mask=response_mask,
        rollout_is=cfg.rollout_is,
        rollout_is_threshold=cfg.rollout_is_threshold,
        rollout_rs=cfg.rollout_rs,
        rollout_rs_threshold=cfg.rollout_rs_threshold,
    )
    tensor = None if weights is None else weights.batch["rollout_is_weights"]
    named = {
        k if k.startswith("rollout_corr/") else f"rollout_corr/{k}": float(v)
        for k, v in metrics.items()
    }
    return tensor, mask, named


def policy_loss(
    cfg: AlgorithmConfig,
    old_logprobs: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """veRL's policy loss (a scalar) and its metrics (``actor/pg_clipfrac``, ...)."""
    fn = core_algos.get_policy_loss_fn(cfg.policy_loss.value)
    loss, metrics = fn(
        old_log_prob=old_logprobs,
        log_prob=logprobs,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=actor_config(cfg),
        rollout_is_weights=is_weights,
    )
    return loss, dict(metrics)
