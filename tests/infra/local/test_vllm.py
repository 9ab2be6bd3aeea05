"""The local vLLM server: exact token ids and logprobs from the engine."""

from __future__ import annotations

from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

from infra.local.vllm import VLLMServer


def _reference_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    """Logprob of each completion token under a transformers forward pass of the same weights."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    # The token at position p is predicted by the logits at position p - 1.
    return [float(logp[len(prompt) + i - 1, tok]) for i, tok in enumerate(completion)]


def test_chat_completion_token_ids_and_logprobs_match_transformers(
    vllm_server: VLLMServer, tiny_model_dir: Path
) -> None:
    resp = httpx.post(
        f"{vllm_server.base_url}/v1/chat/completions",
        json={
            "model": vllm_server.served_model_name,
            "messages": [{"role": "user", "content": "list the files and print hello"}],
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": 7,
            "logprobs": True,
            "return_token_ids": True,
        },
        timeout=120,
    )
    resp.raise_for_status()
    body = resp.json()
    prompt: list[int] = body["prompt_token_ids"]
    choice = body["choices"][0]
    completion: list[int] = choice["token_ids"]
    engine = [entry["logprob"] for entry in choice["logprobs"]["content"]]

    assert len(completion) == len(engine) == body["usage"]["completion_tokens"] > 0
    assert len(prompt) == body["usage"]["prompt_tokens"]
    reference = _reference_logprobs(tiny_model_dir, prompt, completion)
    diffs = [abs(a - b) for a, b in zip(engine, reference, strict=True)]
    assert max(diffs) < 1e-4, diffs
    # Real distributions, not one-hot: the tiny model is sampled, not degenerate.
    assert min(engine) < -0.5
