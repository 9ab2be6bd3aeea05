"""The veRL backend, run for real on CPU: veRL's FSDP engine, our batches, our algorithms.

The same update through the CPU reference backend and through veRL's engine must agree; what the
veRL backend exports must be what vLLM then serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infra.local.vllm import VLLMServer
from schemas.errors import ConfigError
from tests.trainer.test_loop import _episodes
from tests.trainer.test_weight_sync import _vllm_logprobs
from trainer.algorithms import AlgorithmConfig
from trainer.backends.cpu import CPUBackend
from trainer.backends.verl_fsdp import VerlBackend, VerlConfig
from trainer.batch import to_batch
from trainer.weight_sync import WeightSync

LR = 1e-3


@pytest.fixture(scope="module")
def verl_backend(tiny_model_dir: Path) -> VerlBackend:
    return VerlBackend(tiny_model_dir, VerlConfig(lr=LR))


def test_logprobs_and_one_update_match_the_reference_backend(
    verl_backend: VerlBackend, tiny_model_dir: Path
) -> None:
    batch = to_batch(_episodes(8, 4))
    reference = CPUBackend(tiny_model_dir, lora_rank=None, lr=LR, micro_batch=3)
    mask = batch.response_mask.bool()
    before = verl_backend.logprobs(batch)
    assert torch.allclose(before[mask], reference.logprobs(batch)[mask], atol=1e-4)

    algo = AlgorithmConfig()
    got = verl_backend.train_step(batch, algo)
    want = reference.train_step(batch, algo)
    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], abs=1e-5)
    assert got["rollout_corr/rollout_is_mean"] == pytest.approx(
        want["rollout_corr/rollout_is_mean"], abs=1e-6
    )
    after = verl_backend.logprobs(batch)
    assert (after - before)[mask].abs().max() > 1e-3  # it learned
    assert torch.allclose(after[mask], reference.logprobs(batch)[mask], atol=2e-4)


def test_checkpoint_round_trip(verl_backend: VerlBackend, tmp_path: Path) -> None:
    batch = to_batch(_episodes(4, 2))
    verl_backend.save(tmp_path / "ckpt")
    saved = verl_backend.logprobs(batch)
    verl_backend.train_step(batch, AlgorithmConfig())
    assert not torch.allclose(verl_backend.logprobs(batch), saved)
    verl_backend.load(tmp_path / "ckpt")
    assert torch.allclose(verl_backend.logprobs(batch), saved, atol=1e-6)


def test_exported_weights_are_what_vllm_serves(
    verl_backend: VerlBackend, vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    batch = to_batch(_episodes(4, 2))
    verl_backend.train_step(batch, AlgorithmConfig())
    sync = WeightSync(vllm_server.base_url, mode="full")
    try:
        sync.swap(verl_backend.export_for_inference(tmp_path / "export"), policy_version=1)
        ids = batch.input_ids[0].tolist()
        engine = torch.tensor(_vllm_logprobs(vllm_server, vllm_server.served_model_name, ids))
        trainer = verl_backend.logprobs(batch)[0]  # response positions only
        mask = batch.response_mask[0].bool()
        assert (engine[mask] - trainer[mask]).abs().max() < 1e-4
    finally:
        sync.load_full(tiny_model_dir)


def test_lora_adapter_export_is_what_vllm_serves(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = VerlBackend(tiny_model_dir, VerlConfig(lr=1e-2, lora_rank=8))
    batch = to_batch(_episodes(8, 4))
    for _ in range(2):  # LoRA starts as a no-op
        backend.train_step(batch, AlgorithmConfig())
    adapter = backend.export_for_inference(tmp_path / "adapter")
    WeightSync(vllm_server.base_url, lora_name="verl-policy").swap(adapter, policy_version=1)
    ids = batch.input_ids[0].tolist()
    engine = torch.tensor(_vllm_logprobs(vllm_server, "verl-policy", ids))
    base = torch.tensor(_vllm_logprobs(vllm_server, vllm_server.served_model_name, ids))
    trainer = backend.logprobs(batch)[0]
    mask = batch.response_mask[0].bool()
    assert (engine[mask] - trainer[mask]).abs().max() < 1e-4
    assert (base[mask] - trainer[mask]).abs().max() > 1e-3  # the adapter matters


def test_a_batch_with_images_is_refused_not_trained_without_its_pixels(
    verl_backend: VerlBackend,
) -> None:
    batch = to_batch(_episodes(4, 2))
    batch.image_ids = [["0" * 64], [], [], []]
    with pytest.raises(ConfigError, match="does not train on yet"):
        verl_backend.logprobs(batch)
    with pytest.raises(ConfigError, match="does not train on yet"):
        verl_backend.train_step(batch, AlgorithmConfig())
