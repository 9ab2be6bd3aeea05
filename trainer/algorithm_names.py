"""The advantage estimators and policy losses a trainer config can name: veRL's names, as enums
checked when the config is built (a bad name lists the valid ones).

Values are veRL's registry keys (``ADV_ESTIMATOR_REGISTRY`` and ``POLICY_LOSS_REGISTRY`` in
``verl.trainer.ppo.core_algos``). Only those this trainer computes are members: the estimators
that need nothing but outcome rewards, the response mask and the groups, and the losses whose
settings our actor config carries. veRL's others are left out: ``gae`` (a value model),
``remax`` (greedy-baseline rewards), ``optimal_token_baseline`` and
``tir_optimal_token_baseline`` (old logprobs and the squared policy sums), ``reinforce_plus_plus``
and ``grpo_passk`` (veRL's algorithm config, which ``trainer.algorithms`` does not pass), and the
loss ``dro`` (``policy_loss.dro_beta``, unset). ``tests/trainer/test_algorithm_names.py`` checks
that each member runs and each name left out fails. This module imports neither torch nor veRL:
naming an algorithm stays cheap (the CLI and the train config do).
"""

from __future__ import annotations

from enum import StrEnum


class AdvantageEstimator(StrEnum):
    """How advantages are computed from outcome rewards (shapes in ``trainer.algorithms``)."""

    GRPO = "grpo"  # reward normalised within its group (arXiv:2402.03300)
    GRPO_VECTORIZED = "grpo_vectorized"  # the same, computed without a Python loop
    GDPO = "gdpo"  # group reward-decoupled normalisation (arXiv:2601.05242)
    GPG = "gpg"  # group policy gradient: reward minus the group mean, rescaled
    OPO = "opo"  # optimal baseline, length-weighted group mean (arXiv:2505.23585)
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"  # arXiv:2501.03262
    RLOO = "rloo"  # leave-one-out group mean as the baseline (arXiv:2402.14740)
    RLOO_VECTORIZED = "rloo_vectorized"  # the same, computed without a Python loop


class PolicyLoss(StrEnum):
    """The policy objective (veRL's ``loss_mode``)."""

    VANILLA = "vanilla"  # PPO's clipped objective, dual-clipped (arXiv:1707.06347)
    BYPASS_MODE = "bypass_mode"  # REINFORCE or PPO-clip against the behavior logprobs
    CISPO = "cispo"  # clipped IS-weight policy optimisation (arXiv:2506.13585)
    CLIP_COV = "clip_cov"  # clips the tokens of highest covariance (arXiv:2505.22617)
    DPPO_KL = "dppo_kl"  # DPPO, binary KL trust region (arXiv:2602.04879)
    DPPO_TV = "dppo_tv"  # DPPO, binary total-variation trust region (arXiv:2602.04879)
    GEO_MEAN = "geo_mean"  # GMPO: the geometric mean of token ratios (arXiv:2507.20673)
    GPG = "gpg"  # plain policy gradient, no ratio clipping
    GSPO = "gspo"  # sequence-level ratio and clipping (arXiv:2507.18071)
    KL_COV = "kl_cov"  # KL penalty on the tokens of highest covariance (arXiv:2505.22617)
    SAPO = "sapo"  # soft adaptive policy optimisation: a smooth gate (arXiv:2511.20347)
