"""The CPU backend's one-pass update equals the two-pass update it replaces (old logprobs from a
separate no-grad pass, correction and loss weights over the whole batch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.trainer.test_loop import _episodes
from trainer.algorithms import AlgorithmConfig, compute_advantages, policy_loss, rollout_correction
from trainer.backends.cpu import CPUBackend
from trainer.batch import TrainBatch, to_batch


def _two_pass_step(backend: CPUBackend, batch: TrainBatch, algo: AlgorithmConfig) -> float:
    old = backend.logprobs(batch)
    mask = batch.response_mask
    advantages = compute_advantages(algo, batch.token_level_rewards, mask, batch.index)
    is_weights, corr_mask, _ = rollout_correction(algo, old, batch.behavior_logprobs, mask)
    assert is_weights is not None
    backend.model.train()
    backend.optimizer.zero_grad()
    total = float(corr_mask.sum())
    pg_loss = 0.0
    for i in range(0, batch.size, backend.micro_batch):
        rows = slice(i, i + backend.micro_batch)
        new = backend._logprobs(batch, rows)
        loss, _ = policy_loss(
            algo, old[rows], new, advantages[rows], corr_mask[rows], is_weights[rows]
        )
        weight = float(corr_mask[rows].sum()) / total
        (loss * weight).backward()
        pg_loss += loss.item() * weight
    params = [p for p in backend.model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    backend.optimizer.step()
    return pg_loss


@pytest.mark.parametrize("algo", [AlgorithmConfig(), AlgorithmConfig(rollout_is="sequence")])
def test_one_pass_update_equals_the_two_pass_update(
    tiny_model_dir: Path, algo: AlgorithmConfig
) -> None:
    batch = to_batch(_episodes(8, 3))  # micro-batches of 3, 3 and 2 rows
    one = CPUBackend(tiny_model_dir, lora_rank=8, lr=5e-2, micro_batch=3)
    two = CPUBackend(tiny_model_dir, lora_rank=8, lr=5e-2, micro_batch=3)
    before = one.logprobs(batch)
    metrics = one.train_step(batch, algo)
    want_loss = _two_pass_step(two, batch, algo)
    assert metrics["actor/pg_loss"] == pytest.approx(want_loss, abs=1e-6)
    assert metrics["actor/behavior_kl"] == pytest.approx(
        float((before - batch.behavior_logprobs)[batch.response_mask.bool()].mean()), abs=1e-6
    )
    after_one, after_two = one.logprobs(batch), two.logprobs(batch)
    assert (after_one - before).abs().max() > 1e-3  # it learned
    assert torch.allclose(after_one, after_two, atol=1e-5)


def test_with_dropout_old_logprobs_come_from_an_eval_pass(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Dropout makes the training pass differ from the pre-update policy, so a model with
    dropout gets its old logprobs from a separate no-grad pass in eval mode."""
    assert not CPUBackend(tiny_model_dir, lora_rank=8).dropout
    model = tmp_path / "dropout"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    backend = CPUBackend(model, lora_rank=8, micro_batch=3)
    assert backend.dropout
    batch = to_batch(_episodes(8, 3))
    before = backend.logprobs(batch)
    metrics = backend.train_step(batch, AlgorithmConfig())
    assert metrics["actor/behavior_kl"] == pytest.approx(
        float((before - batch.behavior_logprobs)[batch.response_mask.bool()].mean()), abs=1e-6
    )
