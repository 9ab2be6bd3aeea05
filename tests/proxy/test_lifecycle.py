"""The call lifecycle: every exit path records one completion event, counts the call once and
gives its concurrency slot back.

The real app under uvicorn, in front of the fast vLLM-format upstream (paced, so a stream is
still running when the client hangs up), and once in front of real vLLM.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.local.vllm import VLLMServer
from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
TOKENS = 100  # the fast upstream's generation length, paced 10 ms a token
CONTEXT = 64  # the proxy's context length: "hi" renders to 10 tokens, fits


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    upstream_app = fast_upstream.create_app(str(tiny_model_dir), TOKENS, token_delay=0.01)
    with serve_in_thread(upstream_app, "fast upstream") as upstream:
        tmp = Path(tmp_path_factory.mktemp("lifecycle"))
        config = proxy_config(
            upstream,
            tmp,
            auto_register=True,
            max_model_len=CONTEXT,
            pause_mode="reject",
        )
        with running_proxy(config) as p:
            yield p


def _calls(p: RunningProxy, status: int, dialect: str = "chat") -> float:
    value = p.state.metrics.registry.get_sample_value(
        "openforge_proxy_requests_total", {"dialect": dialect, "status": str(status)}
    )
    return value or 0.0


def _events(p: RunningProxy, rollout: str, want: int) -> list[CompletionEvent]:
    """The rollout's completion events, once ``want`` are there (and a moment for strays)."""
    deadline = time.monotonic() + 30
    events: list[CompletionEvent] = []
    while len(events) < want and time.monotonic() < deadline:
        p.flush()
        group = f"{rollout}-{uuid.uuid4().hex[:6]}"
        events = completions_of(read_events(p.config.log_url, group, want, timeout=2), rollout)
    return events


def _idle(p: RunningProxy) -> bool:
    deadline = time.monotonic() + 10
    while p.state.gate.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    in_flight = p.state.metrics.registry.get_sample_value("openforge_proxy_in_flight")
    return p.state.gate.in_flight == 0 and in_flight == 0


def test_successful_calls_record_once_and_release_their_slot(proxy: RunningProxy) -> None:
    rollout = f"ok-{uuid.uuid4().hex[:6]}"
    base = f"{proxy.url}/rollout/{rollout}/v1"
    before = _calls(proxy, 200), _calls(proxy, 200, "messages")
    resp = httpx.post(f"{base}/chat/completions", json=CHAT, timeout=60)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == TOKENS
    with httpx.stream(
        "POST", f"{base}/chat/completions", json={**CHAT, "stream": True}, timeout=60
    ) as stream:
        assert stream.status_code == 200
        assert list(stream.iter_lines())[-2:] == ["data: [DONE]", ""]
    resp = httpx.post(f"{base}/messages", json={**MESSAGES, "stream": True}, timeout=60)
    assert resp.status_code == 200 and "event: message_stop" in resp.text
    assert _idle(proxy)
    events = _events(proxy, rollout, 3)
    assert [e.call_index for e in events] == [0, 1, 2]
    assert all(e.status is CompletionStatus.OK for e in events)
    assert [e.streamed for e in events] == [False, True, True]
    assert all(len(e.completion_token_ids) == TOKENS for e in events)
    assert all(e.response_body and e.timings.first_token_us for e in events)
    assert _calls(proxy, 200) == before[0] + 2
    assert _calls(proxy, 200, "messages") == before[1] + 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_upstream_error_keeps_its_status_and_is_recorded_once(
    proxy: RunningProxy, stream: bool
) -> None:
    rollout = f"up-{stream}-{uuid.uuid4().hex[:6]}"
    before = _calls(proxy, 400)
    bad = {**CHAT, "temperature": -1.0, "stream": stream}
    resp = httpx.post(f"{proxy.url}/rollout/{rollout}/v1/chat/completions", json=bad, timeout=60)
    # Stream or not, the headers waited for the upstream: its status, not a 200 with an error.
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "upstream_error"
    assert "non-negative" in resp.json()["error"]["message"]
    assert _idle(proxy)
    (event,) = _events(proxy, rollout, 1)
    assert event.status is CompletionStatus.UPSTREAM_ERROR and "non-negative" in (event.error or "")
    assert event.completion_token_ids == []
    assert _calls(proxy, 400) == before + 1


def test_a_prompt_longer_than_the_context_is_recorded_as_rejected(proxy: RunningProxy) -> None:
    rollout = f"long-{uuid.uuid4().hex[:6]}"
    url = f"{proxy.url}/rollout/{rollout}/v1/messages"
    long = {**MESSAGES, "messages": [{"role": "user", "content": "hello world " * 50}]}
    resp = httpx.post(url, json=long, headers={"anthropic-version": "2023-06-01"}, timeout=60)
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    assert "context" in resp.json()["error"]["message"]
    assert httpx.post(url, json=MESSAGES, timeout=60).status_code == 200
    assert _idle(proxy)
    refused, answered = _events(proxy, rollout, 2)
    assert refused.status is CompletionStatus.REJECTED and refused.completion_token_ids == []
    assert refused.prompt_length > CONTEXT and refused.call_index == 0
    assert answered.status is CompletionStatus.OK and answered.call_index == 1


def test_a_client_that_hangs_up_mid_stream_is_recorded_once(proxy: RunningProxy) -> None:
    rollout = f"gone-{uuid.uuid4().hex[:6]}"
    body = {**CHAT, "stream": True}
    with httpx.stream(
        "POST", f"{proxy.url}/rollout/{rollout}/v1/chat/completions", json=body, timeout=60
    ) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())  # the first chunk, then hang up
    assert _idle(proxy)
    (event,) = _events(proxy, rollout, 1)
    assert event.status is CompletionStatus.CLIENT_DISCONNECTED
    assert event.error == "client disconnected mid-stream"
    assert event.streamed and 0 < len(event.completion_token_ids) < TOKENS
    assert len(event.completion_logprobs) == len(event.completion_token_ids)
    time.sleep(0.5)  # nothing more arrives for it
    assert len(_events(proxy, rollout, 1)) == 1


def test_a_call_refused_before_admission_holds_no_slot_and_records_nothing(
    proxy: RunningProxy,
) -> None:
    rollout = f"paused-{uuid.uuid4().hex[:6]}"
    url = f"{proxy.url}/rollout/{rollout}/v1/chat/completions"
    assert httpx.post(f"{proxy.url}/admin/pause", headers=proxy.admin_headers).status_code == 200
    try:
        resp = httpx.post(url, json=CHAT, timeout=60)
        assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
    finally:
        assert (
            httpx.post(f"{proxy.url}/admin/resume", headers=proxy.admin_headers).status_code == 200
        )
    assert httpx.post(url, json=CHAT, timeout=60).status_code == 200
    assert _idle(proxy)
    (event,) = _events(proxy, rollout, 1)
    assert event.call_index == 0 and event.status is CompletionStatus.OK


def test_a_draining_pause_answers_once_the_calls_in_flight_have_ended(
    proxy: RunningProxy,
) -> None:
    """``POST /admin/pause`` with ``drain_s`` waits for the admitted calls (the weight swap's
    guarantee: no call is in flight while the weights change), up to ``drain_s``."""
    rollout = f"drain-{uuid.uuid4().hex[:6]}"
    url = f"{proxy.url}/rollout/{rollout}/v1/chat/completions"
    pause, admin = f"{proxy.url}/admin/pause", proxy.admin_headers
    first, failures = threading.Event(), []

    def call() -> None:
        try:
            with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=60) as resp:
                assert resp.status_code == 200
                for _ in resp.iter_lines():
                    first.set()
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)
        finally:
            first.set()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        assert first.wait(30) and not failures  # in flight, at least 1 s (100 tokens, 10 ms)
        short = httpx.post(pause, json={"drain_s": 0.05}, headers=admin, timeout=30).json()
        assert short["paused"] and short["in_flight"] == 1  # not drained in time: says so
        drained = httpx.post(pause, json={"drain_s": 30}, headers=admin, timeout=60).json()
        answered_us = time.time_ns() // 1000
        assert drained["paused"] and drained["in_flight"] == 0
        for bad in (-1, "1", True):
            resp = httpx.post(pause, json={"drain_s": bad}, headers=admin, timeout=30)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "drain_s"
    finally:
        assert httpx.post(f"{proxy.url}/admin/resume", headers=admin).status_code == 200
    caller.join(30)
    assert not caller.is_alive() and not failures, failures
    (event,) = _events(proxy, rollout, 1)
    assert event.status is CompletionStatus.OK and len(event.completion_token_ids) == TOKENS
    assert event.timings.done_us is not None and event.timings.done_us <= answered_us


def test_client_disconnect_is_recorded_and_aborts_upstream(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """The client hangs up after the first chunk. Where the model had already finished (its
    end of sequence early, the whole answer in that chunk) the call was answered and is recorded
    as such; a few seeds make sure one hang-up comes mid-answer, which is recorded as a
    disconnect with the tokens generated so far."""
    config = proxy_config(vllm_server.base_url, tmp_path, auto_register=True)
    with running_proxy(config) as p:
        for seed in (5, 6, 7, 8):
            event = _hang_up_after_the_first_chunk(p, seed)
            if event.status is CompletionStatus.OK:  # it had ended before the hang-up
                assert event.finish_reason in ("stop", "length"), event
                continue
            break
    assert event.status is CompletionStatus.CLIENT_DISCONNECTED
    assert event.streamed and len(event.completion_token_ids) < 4000
    assert len(event.completion_logprobs) == len(event.completion_token_ids)


def _hang_up_after_the_first_chunk(p: RunningProxy, seed: int) -> CompletionEvent:
    """One streamed call of a new rollout, abandoned after its first chunk; its one event."""
    rollout = f"d-{uuid.uuid4().hex[:6]}"
    body = {**CHAT, "max_tokens": 4000, "stream": True, "seed": seed, "temperature": 1.0}
    with httpx.stream(
        "POST", f"{p.url}/rollout/{rollout}/v1/chat/completions", json=body, timeout=60
    ) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())  # first chunk, then hang up
    deadline = time.monotonic() + 30
    events: list[CompletionEvent] = []
    while not events and time.monotonic() < deadline:
        p.flush()
        events = completions_of(
            read_events(p.config.log_url, group=rollout, want=1, timeout=2), rollout
        )
    (event,) = events
    return event
