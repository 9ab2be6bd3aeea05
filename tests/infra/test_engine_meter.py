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
