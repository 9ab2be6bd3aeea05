"""Faults injected on purpose at the proxy (issue 53, ``--fault``), against real vLLM: each kind
answers the harness as a failing model server would, in its dialect, and the call it hit is
recorded with it, never as an ordinary upstream failure."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
)
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus
from schemas.faults import FaultKind, FaultPlan

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
MESSAGES = {**CHAT, "model": "claude"}


@contextmanager
def _proxy(vllm: VLLMServer, tmp: Path, plan: FaultPlan) -> Iterator[RunningProxy]:
    config = dataclasses.replace(proxy_config(vllm.base_url, tmp, auto_register=True), faults=plan)
    with running_proxy(config) as p:
        yield p


def _only_call(p: RunningProxy, rollout: str) -> CompletionEvent:
    p.flush()
    (event,) = completions_of(read_events(p.config.log_url, want=1), rollout)
    return event


@pytest.mark.parametrize(
    ("kind", "path", "status", "error_type"),
    [
        (FaultKind.HTTP_503, "v1/chat/completions", 503, "server_error"),
        (FaultKind.HTTP_500, "v1/chat/completions", 500, "server_error"),
        (FaultKind.HTTP_429, "v1/messages", 429, "rate_limit_error"),
    ],
)
def test_a_refusal_answers_in_the_dialect_with_retry_after_and_is_recorded_as_the_fault(
    vllm_server: VLLMServer,
    tmp_path: Path,
    kind: FaultKind,
    path: str,
    status: int,
    error_type: str,
) -> None:
    rollout = f"f-{uuid.uuid4().hex[:6]}"
    with _proxy(vllm_server, tmp_path, FaultPlan({kind: 1.0}, retry_after_s=2)) as p:
        body = MESSAGES if "messages" in path else CHAT
        answer = httpx.post(f"{p.url}/rollout/{rollout}/{path}", json=body, timeout=60)
        event = _only_call(p, rollout)
    assert answer.status_code == status, answer.text
    assert answer.headers.get("retry-after") == ("2" if status != 500 else None)
    error = answer.json()["error"]
    assert error["type"] == error_type and "injected fault" in error["message"]
    assert event.fault == kind.value
    assert event.status is CompletionStatus.UPSTREAM_ERROR
    assert event.completion_token_ids == []  # the engine never ran


def test_a_cut_stream_closes_mid_answer_and_is_recorded_with_its_tokens(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    rollout = f"f-{uuid.uuid4().hex[:6]}"
    plan = FaultPlan({FaultKind.STREAM_CUT: 1.0}, cut_after_chunks=2)
    with _proxy(vllm_server, tmp_path, plan) as p:
        url = f"{p.url}/rollout/{rollout}/v1/chat/completions"
        chunks: list[str] = []
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=60) as stream,
        ):
            for line in stream.iter_lines():
                chunks.append(line)
        # A call that is not streamed is never cut: it is answered whole.
        whole = httpx.post(f"{p.url}/rollout/{rollout}-whole/v1/chat/completions", json=CHAT)
        event = _only_call(p, rollout)
    assert chunks and not any("[DONE]" in c for c in chunks)  # no end of stream
    assert whole.status_code == 200
    assert event.fault == "stream_cut"
    assert event.status is CompletionStatus.UPSTREAM_ERROR
    assert "cut after 2 chunks" in (event.error or "")


def test_a_slow_first_byte_answers_late_but_whole(vllm_server: VLLMServer, tmp_path: Path) -> None:
    rollout = f"f-{uuid.uuid4().hex[:6]}"
    plan = FaultPlan({FaultKind.SLOW_FIRST_BYTE: 1.0}, delay_s=1.0)
    with _proxy(vllm_server, tmp_path, plan) as p:
        start = time.monotonic()
        answer = httpx.post(f"{p.url}/rollout/{rollout}/v1/chat/completions", json=CHAT, timeout=60)
        took = time.monotonic() - start
        event = _only_call(p, rollout)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"] is not None
    assert took >= 1.0
    assert event.fault == "slow_first_byte"
    assert event.status is CompletionStatus.OK and event.completion_token_ids


def test_without_a_plan_no_call_carries_a_fault(vllm_server: VLLMServer, tmp_path: Path) -> None:
    rollout = f"f-{uuid.uuid4().hex[:6]}"
    with _proxy(vllm_server, tmp_path, FaultPlan({FaultKind.HTTP_503: 0.0})) as p:
        answer = httpx.post(f"{p.url}/rollout/{rollout}/v1/chat/completions", json=CHAT, timeout=60)
        event = _only_call(p, rollout)
    assert answer.status_code == 200
    assert event.fault is None and event.status is CompletionStatus.OK
