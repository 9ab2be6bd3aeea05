"""After a LoRA hot-load, vLLM's logprobs for a fixed prompt match the trainer's within 1e-4."""

from __future__ import annotations

from pathlib import Path

import httpx
import torch

from infra.local.vllm import VLLMServer
from openforge.testing.episodes import fixed_episodes
from trainer.algorithms import AlgorithmConfig
from trainer.backends.cpu import CPUBackend
from trainer.batch import to_batch
from trainer.weight_sync import WeightSync


def _vllm_logprobs(server: VLLMServer, model: str, ids: list[int]) -> list[float]:
    resp = httpx.post(
        f"{server.base_url}/v1/completions",
        json={
            "model": model,
            "prompt": ids,
            "max_tokens": 1,
            "prompt_logprobs": 0,
            "temperature": 1.0,
        },
        timeout=120,
    )
    resp.raise_for_status()
    entries = resp.json()["choices"][0]["prompt_logprobs"]
    return [float(entries[i][str(tok)]["logprob"]) for i, tok in enumerate(ids) if i > 0]


def test_lora_hot_load_matches_trainer_logprobs(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = CPUBackend(tiny_model_dir, lora_rank=8, lr=5e-2)
    batch = to_batch(fixed_episodes())
    for _ in range(2):  # LoRA starts as a no-op; two updates make it matter
        backend.train_step(batch, AlgorithmConfig())
    adapter = backend.export_for_inference(tmp_path / "adapter")
    seconds = WeightSync(vllm_server.base_url, lora_name="policy").swap(adapter, policy_version=1)
    assert seconds > 0  # recorded; bench/weight_sync.py measures it

    ids = batch.input_ids[0].tolist()
    trainer = backend.logprobs(batch)[0].tolist()
    engine = _vllm_logprobs(vllm_server, "policy", ids)
    base = _vllm_logprobs(vllm_server, vllm_server.served_model_name, ids)
    assert max(abs(a - b) for a, b in zip(engine, trainer, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(base, trainer, strict=True)) > 1e-3  # it did change

    # A second update, loaded in place under the same name, is served at once.
    backend.train_step(batch, AlgorithmConfig())
    WeightSync(vllm_server.base_url, lora_name="policy").swap(
        backend.export_for_inference(tmp_path / "adapter2"), policy_version=2
    )
    trainer2 = backend.logprobs(batch)[0].tolist()
    engine2 = _vllm_logprobs(vllm_server, "policy", ids)
    assert max(abs(a - b) for a, b in zip(engine2, trainer2, strict=True)) < 1e-4
    assert torch.tensor(trainer2).ne(torch.tensor(trainer)).any()


def test_full_weight_reload_matches_trainer_logprobs(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Full-weight training: vLLM drains, reloads every weight in place, and then serves exactly
    the trainer's model under its base name."""
    backend = CPUBackend(tiny_model_dir, lora_rank=None, lr=1e-2)
    batch = to_batch(fixed_episodes())
    ids = batch.input_ids[0].tolist()
    name = vllm_server.served_model_name
    before = _vllm_logprobs(vllm_server, name, ids)
    backend.train_step(batch, AlgorithmConfig())
    sync = WeightSync(vllm_server.base_url, mode="full")
    try:
        seconds = sync.swap(backend.export_for_inference(tmp_path / "full"), policy_version=1)
        assert seconds > 0
        trainer = backend.logprobs(batch)[0].tolist()
        engine = _vllm_logprobs(vllm_server, name, ids)
        assert max(abs(a - b) for a, b in zip(engine, trainer, strict=True)) < 1e-4
        assert max(abs(a - b) for a, b in zip(engine, before, strict=True)) > 1e-3
    finally:
        sync.load_full(tiny_model_dir)  # the session's server goes back to the base weights
    restored = _vllm_logprobs(vllm_server, name, ids)
    assert max(abs(a - b) for a, b in zip(restored, before, strict=True)) < 1e-5
