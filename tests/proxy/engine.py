"""Checks against the engine itself: replay a recorded prompt on vLLM and compare."""

from __future__ import annotations

import math

import httpx

from schemas.completion import CompletionEvent


def replay(vllm_url: str, model: str, prompt: list[int], event: CompletionEvent) -> dict:  # type: ignore[type-arg]
    """Generate again from ``prompt`` with the event's seed and length, straight from vLLM."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max(len(event.completion_token_ids), 1),
        "temperature": event.sampling.temperature,
        "seed": event.sampling.seed,
        "logprobs": 0,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{vllm_url}/v1/completions", json=body, timeout=120)
    resp.raise_for_status()
    return dict(resp.json()["choices"][0])


def assert_engine_agrees(
    vllm_url: str, model: str, prompt: list[int], event: CompletionEvent
) -> str:
    """The recorded completion ids and logprobs are what vLLM generates for this prompt."""
    choice = replay(vllm_url, model, prompt, event)
    assert choice["token_ids"] == event.completion_token_ids
    engine = choice["logprobs"]["token_logprobs"]
    assert len(engine) == len(event.completion_logprobs)
    for a, b in zip(engine, event.completion_logprobs, strict=True):
        assert math.isclose(a, b, abs_tol=1e-5), (a, b)
    return str(choice["text"])


def engine_chat_prompt(
    vllm_url: str, model: str, messages: list[dict], tools: list[dict]
) -> list[int]:  # type: ignore[type-arg]
    """vLLM's own rendering of a conversation (its chat template, its tokenizer)."""
    body = {"model": model, "messages": messages, "max_tokens": 1, "return_token_ids": True}
    if tools:
        body["tools"] = tools
    resp = httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120)
    resp.raise_for_status()
    return list(resp.json()["prompt_token_ids"])
