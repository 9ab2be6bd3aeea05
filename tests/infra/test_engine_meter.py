"""The engine meter against a real vLLM: idle reads 0, a long generation reads busy."""

from __future__ import annotations

import threading
import time

import httpx

from infra.engine_meter import EngineMeter, running
from infra.local.vllm import VLLMServer


def test_running_is_summed_over_label_sets_and_absent_is_none() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="tiny"} 1.0\n'
        "vllm:num_requests_running_other 5.0\n"
    )
    assert running(text) == 3.0
    assert running("vllm:num_requests_waiting 1.0\n") is None


def test_the_meter_reads_idle_then_busy_during_a_generation(vllm_server: VLLMServer) -> None:
    with EngineMeter(vllm_server.base_url, interval=0.05) as meter:
        time.sleep(0.5)
        assert meter.take() == 0.0  # nothing ran
        body = {
            "model": vllm_server.served_model_name,
            "prompt": "hello",
            "max_tokens": 1500,
            "min_tokens": 1500,
            "ignore_eos": True,
        }
        call = threading.Thread(
            target=lambda: httpx.post(
                f"{vllm_server.base_url}/v1/completions", json=body, timeout=300
            )
        )
        call.start()
        call.join()
        busy = meter.take()
    assert busy is not None and busy > 0.5, busy


def test_engine_totals_split_each_call_and_see_the_prefix_cache(vllm_server: VLLMServer) -> None:
    """Two calls with one long shared prompt: vLLM's own counters give each call's prefill and
    decode time and tokens, and the second call's prompt comes from the prefix cache."""
    prompt = list(range(10, 410)) * 3  # 1,200 token ids, the same both times
    body = {"model": vllm_server.served_model_name, "prompt": prompt, "max_tokens": 8,
            "min_tokens": 8, "ignore_eos": True}  # fmt: skip
    with EngineMeter(vllm_server.base_url, interval=1.0) as meter:
        for _ in range(2):
            httpx.post(f"{vllm_server.base_url}/v1/completions", json=body, timeout=120)
        totals = meter.since_start()
    per_call = totals.per_call()
    assert totals.requests == 2 and totals.generation_tokens == 16
    assert totals.prompt_tokens == 2 * len(prompt)
    assert per_call["prefill_ms_per_call"] > 0 and per_call["decode_ms_per_call"] > 0
    # The second call's prompt (all but its last partial block) was served from the cache.
    assert totals.prefix_cache_hits >= len(prompt) // 2, totals
    assert 0.25 <= per_call["prefix_cache_hit_rate"] <= 0.5
