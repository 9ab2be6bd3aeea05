"""After a LoRA hot-load, vLLM's logprobs for a fixed prompt match the trainer's within 1e-4;
a call in flight through the proxy during a swap keeps its version and its weights."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from infra.local.vllm import VLLMServer
from openforge.testing import fast_upstream
from openforge.testing.episodes import fixed_episodes
from openforge.testing.proxy import (
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from schemas.completion import CompletionEvent, PolicySpan
from schemas.enums import CompletionStatus
from schemas.errors import ServiceError
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


IN_FLIGHT_TOKENS = 1500  # long enough to be still generating when the swap starts
AFTER_TOKENS = 200


def _random_adapter(model_dir: Path, seed: int, out: Path) -> Path:
    """A LoRA adapter with random weights (B is zero at init; here it is not), so two seeds
    generate different greedy text from the first token on."""
    backend = CPUBackend(model_dir, lora_rank=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return backend.export_for_inference(out)


def _greedy(server: VLLMServer, model: str, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens for ``prompt`` straight from vLLM (the model alone, no proxy)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    resp = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
    resp.raise_for_status()
    return list(resp.json()["choices"][0]["token_ids"])


def _only_call(log_url: str, rollout: str) -> CompletionEvent:
    events: list[CompletionEvent] = []
    deadline = time.monotonic() + 60
    while not events and time.monotonic() < deadline:
        events = completions_of(read_events(log_url, f"g-{uuid.uuid4().hex[:6]}", 1, 5), rollout)
    (event,) = events
    assert event.status is CompletionStatus.OK and event.prompt_ref_event_id is None
    return event


def _now_us() -> int:
    return time.time_ns() // 1000


def test_a_call_in_flight_during_a_lora_swap_keeps_its_version_and_its_weights(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The swap waits for the call in flight to end before the in-place load: all its tokens
    are the old adapter's, stamped with the old version; the next call gets the new ones."""
    name = f"inflight-{uuid.uuid4().hex[:6]}"
    old = _random_adapter(tiny_model_dir, 1, tmp_path / "old")
    new = _random_adapter(tiny_model_dir, 2, tmp_path / "new")
    WeightSync(vllm_server.base_url, lora_name=name).load(old)  # policy version 0
    config = proxy_config(
        vllm_server.base_url,
        tmp_path,
        auto_register=True,
        upstream_model=name,
        tokenizer=tiny_model_dir,
    )
    chat = {
        "model": name,
        "messages": [{"role": "user", "content": "count slowly and never stop"}],
        "temperature": 0.0,
    }
    first_chunk = threading.Event()
    stream_error: list[BaseException] = []

    def stream(url: str) -> None:
        try:
            body = {**chat, "max_tokens": IN_FLIGHT_TOKENS, "stream": True}
            with httpx.stream("POST", url, json=body, timeout=600) as resp:
                assert resp.status_code == 200, resp.read()
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        first_chunk.set()
        except BaseException as exc:  # re-raised in the test's thread
            stream_error.append(exc)
        finally:
            first_chunk.set()

    with running_proxy(config) as p:
        sync = WeightSync(
            vllm_server.base_url,
            lora_name=name,
            proxy_url=p.url,
            admin_token=p.config.admin_token,
            drain_timeout=540.0,
        )
        url = f"{p.url}/rollout/{{}}/v1/chat/completions"
        reader = threading.Thread(target=stream, args=(url.format("during"),), daemon=True)
        reader.start()
        assert first_chunk.wait(300)  # the call is generating on vLLM
        assert not stream_error, stream_error
        swap_started_us = _now_us()
        sync.swap(new, policy_version=1)
        swap_returned_us = _now_us()
        # At once: had the call above still been running, it would now share vLLM's batch with
        # this one, and both would decode with the adapter this one carries (the new one).
        resp = httpx.post(
            url.format("after"), json={**chat, "max_tokens": AFTER_TOKENS}, timeout=600
        )
        assert resp.status_code == 200, resp.text
        reader.join(300)
        assert not reader.is_alive() and not stream_error, stream_error
        p.flush()
        during = _only_call(config.log_url, "during")
        after = _only_call(config.log_url, "after")

    assert during.timings.done_us is not None
    # It was in flight when the swap began, and the swap returned only once it had ended.
    assert during.timings.received_us < swap_started_us < during.timings.done_us
    assert during.timings.done_us <= swap_returned_us <= after.timings.received_us
    # Every token of the call in flight is the old adapter's, stamped with the old version.
    assert len(during.completion_token_ids) == IN_FLIGHT_TOKENS
    assert during.policy_versions == [PolicySpan(0, 0, IN_FLIGHT_TOKENS)]
    WeightSync(vllm_server.base_url, lora_name=f"{name}-old").load(old)  # the old one alone
    prompt = during.prompt_token_ids
    assert prompt == after.prompt_token_ids and len(prompt) == during.prompt_length
    old_greedy = _greedy(vllm_server, f"{name}-old", prompt, IN_FLIGHT_TOKENS)
    assert during.completion_token_ids == old_greedy
    # The call after the swap is the new adapter's, stamped with the new version.
    assert after.policy_versions == [PolicySpan(1, 0, AFTER_TOKENS)]
    new_greedy = _greedy(vllm_server, name, prompt, AFTER_TOKENS)
    assert after.completion_token_ids == new_greedy
    assert new_greedy != old_greedy[:AFTER_TOKENS]  # the two adapters do differ here


def _call_in_flight(proxy_url: str, rollout: str) -> threading.Thread:
    """Start a streamed call through the proxy; returns once its first chunk has arrived."""
    started = threading.Event()

    def call() -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        url = f"{proxy_url}/rollout/{rollout}/v1/chat/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=60) as resp:
                for _ in resp.iter_lines():
                    started.set()
        finally:
            started.set()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert started.wait(30)
    return caller


def test_a_swap_that_cannot_drain_the_calls_in_flight_changes_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A call still running when the drain ends (by ``drain_timeout``, or by the proxy's own
    ``pause_timeout``) stops the swap before vLLM is touched; the proxy is resumed."""
    upstream_app = fast_upstream.create_app(str(tiny_model_dir), 40, token_delay=0.05)
    with serve_in_thread(upstream_app, "fast upstream") as upstream:
        config = proxy_config(upstream, tmp_path, auto_register=True, pause_timeout=0.3)
        with running_proxy(config) as p:
            for drain_timeout, why in [(0.05, "still in flight"), (30.0, "its own timeout")]:
                caller = _call_in_flight(p.url, f"r{drain_timeout}")  # 40 tokens, 50 ms each: 2 s
                sync = WeightSync(
                    "http://127.0.0.1:1",  # never called: the swap stops first
                    proxy_url=p.url,
                    admin_token=p.config.admin_token,
                    drain_timeout=drain_timeout,
                )
                with pytest.raises(ServiceError, match=why) as err:
                    sync.swap(tmp_path / "adapter", policy_version=1)
                assert "the weights were not changed" in str(err.value)
                state = httpx.get(f"{p.url}/admin/policy").json()
                assert state["version"] == 0 and not state["paused"]
                caller.join(30)
                assert not caller.is_alive()
