"""The call lifecycle: a client that hangs up mid-stream is recorded and aborts the upstream."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_client_disconnect_is_recorded_and_aborts_upstream(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, auto_register=True)
    rollout = f"d-{uuid.uuid4().hex[:6]}"
    with running_proxy(config) as p:
        body = {**CHAT, "max_tokens": 3000, "stream": True, "seed": 5, "temperature": 1.0}
        with httpx.stream(
            "POST", f"{p.url}/rollout/{rollout}/v1/chat/completions", json=body, timeout=60
        ) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # first chunk, then hang up
        p.flush()

        deadline = time.monotonic() + 30
        events: list[CompletionEvent] = []
        while not events and time.monotonic() < deadline:
            p.flush()
            events = completions_of(
                read_events(p.config.log_url, group=rollout, want=1, timeout=2), rollout
            )
    (event,) = events
    assert event.status is CompletionStatus.CLIENT_DISCONNECTED
    assert event.streamed and len(event.completion_token_ids) < 3000
    assert len(event.completion_logprobs) == len(event.completion_token_ids)
