"""Open-mode attribution, policy versions, weight-swap gating, upstream errors, metrics."""

from __future__ import annotations

import uuid
from dataclasses import replace
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
from proxy.swap_state import remembered
from schemas.enums import Dialect
from schemas.errors import ConfigError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_open_mode_policy_versions_pause_errors_and_metrics(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, pause_mode="reject", admin_token="adm"
    )
    admin = {"authorization": "Bearer adm"}
    session = uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        # Open mode: plain /v1 traffic is attributed by the harness's own session header.
        resp = httpx.post(
            f"{p.url}/v1/chat/completions", json=CHAT, headers={"session-id": session}, timeout=60
        )
        assert resp.status_code == 200
        trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        assert (
            httpx.post(
                f"{p.url}/v1/messages", json=CHAT, timeout=60, headers={"traceparent": trace}
            ).status_code
            == 200
        )
        resp = httpx.post(f"{p.url}/v1/chat/completions", json=CHAT, timeout=60)
        assert resp.status_code == 401 and "session" in resp.json()["error"]["message"]

        # The trainer sets the policy version; later tokens carry it.
        assert httpx.post(f"{p.url}/admin/policy", json={"version": 7}).status_code == 401
        assert (
            httpx.post(f"{p.url}/admin/policy", json={"version": 7}, headers=admin).json()[
                "version"
            ]
            == 7
        )
        # During a weight swap new requests get 429 with Retry-After (reject mode).
        assert httpx.post(f"{p.url}/admin/pause", headers=admin).status_code == 200
        resp = httpx.post(
            f"{p.url}/v1/chat/completions", json=CHAT, headers={"session-id": session}
        )
        assert resp.status_code == 429 and resp.headers["retry-after"] == "1"
        assert httpx.post(f"{p.url}/admin/resume", headers=admin).status_code == 200
        assert (
            httpx.post(
                f"{p.url}/v1/chat/completions",
                json=CHAT,
                headers={"session-id": session},
                timeout=60,
            ).status_code
            == 200
        )

        # An upstream error keeps its status, in the caller's dialect.
        bad = {**CHAT, "temperature": -3.0}
        resp = httpx.post(
            f"{p.url}/v1/chat/completions", json=bad, headers={"session-id": session}, timeout=60
        )
        assert resp.status_code == 400 and "upstream error" in resp.json()["error"]["message"]
        resp = httpx.post(
            f"{p.url}/v1/messages",
            json=bad,
            headers={"session-id": session, "anthropic-version": "2023-06-01"},
            timeout=60,
        )
        assert resp.status_code == 400 and resp.json()["type"] == "error"

        metrics = httpx.get(f"{p.url}/metrics").text
        assert 'openforge_proxy_requests_total{dialect="chat",status="200"}' in metrics
        assert "openforge_proxy_events_published_total" in metrics
        assert "openforge_proxy_policy_version 7.0" in metrics
        p.flush()
    events = completions_of(
        read_events(config.log_url, group="admin", want=4), f"session-{session}"
    )
    assert [e.policy_versions[0].version for e in events if e.completion_token_ids] == [0, 7]
    assert events[-1].status.value == "upstream_error"
    traced = completions_of(
        read_events(config.log_url, group="admin2", want=4),
        "session-trace-4bf92f3577b34da6a3ce929d0e0e4736",
    )
    assert len(traced) == 1 and traced[0].dialect is Dialect.MESSAGES


def test_a_restarted_proxy_keeps_its_version_and_an_unfinished_pause(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """The version set through /admin/policy survives a restart (spool_dir/policy-version), so
    the first calls after it carry what vLLM serves; --policy-version still sets it. A pause
    not yet resumed survives it too (for what is left of its timeout): a proxy restarted
    mid-swap serves nothing until the trainer has set the new version and resumed it."""
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, admin_token="adm", pause_mode="reject"
    )
    admin = {"authorization": "Bearer adm"}
    with running_proxy(config) as p:  # a swap under way: version 5 set, not yet resumed
        assert httpx.get(f"{p.url}/admin/policy").json()["version"] == 0  # nothing remembered
        httpx.post(f"{p.url}/admin/pause", json={"timeout_s": 120}, headers=admin)
        httpx.post(f"{p.url}/admin/policy", json={"version": 5}, headers=admin).raise_for_status()
    session = uuid.uuid4().hex[:8]

    def call(p: RunningProxy) -> int:
        return httpx.post(
            f"{p.url}/v1/chat/completions", json=CHAT, headers={"session-id": session}, timeout=60
        ).status_code

    with running_proxy(config) as p:
        state = httpx.get(f"{p.url}/admin/policy").json()
        assert state["version"] == 5 and state["paused"] and 0 < state["resumes_in_s"] <= 120
        assert call(p) == 429  # held until the trainer resumes it
        httpx.post(f"{p.url}/admin/resume", headers=admin).raise_for_status()
        assert call(p) == 200
        p.flush()
    [event] = completions_of(read_events(config.log_url, want=1), f"session-{session}")
    assert [s.version for s in event.policy_versions] == [5]
    with running_proxy(replace(config, policy_version=2)) as p:  # resumed: no pause remembered
        state = httpx.get(f"{p.url}/admin/policy").json()
        assert (state["version"], state["paused"]) == (2, False)
    (tmp_path / "spool" / "policy-version").write_text("five\n")
    with pytest.raises(ConfigError, match="not a policy version"):
        remembered(tmp_path / "spool")
