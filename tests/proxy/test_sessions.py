"""Open-mode sessions on a real proxy in front of real vLLM: a session's rollout ends after an
idle time or an explicit finish, its next call starts its next rollout (never a refusal), a
call waiting or in flight keeps it open, and the proxy's memory of sessions stays bounded."""

from __future__ import annotations

import threading
import time
import uuid
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
from proxy.config import ProxyConfig
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError
from schemas.rollout import RolloutEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _call(p: RunningProxy, session: str) -> int:
    resp = httpx.post(
        f"{p.url}/v1/chat/completions", json=CHAT, headers={"session-id": session}, timeout=60
    )
    return resp.status_code


def _until(what: str, done: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _phases(log_url: str, session: str) -> list[tuple[str, RolloutPhase, str | None]]:
    records = read_events(log_url, group=f"g-{uuid.uuid4().hex[:6]}", want=1)
    return [
        (r.rollout_id, r.phase, r.message)
        for r in records
        if isinstance(r, RolloutEvent) and r.metadata.get("session") == session
    ]


def test_an_idle_session_ends_and_its_next_call_starts_its_next_rollout(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=1.0)
    session = uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _call(p, session) == 200 and _call(p, session) == 200
        first = p.state.rollouts.by_session(session)
        assert first is not None and first.rollout_id == f"session-{session}"
        _until("the idle session ends", lambda: p.state.rollouts.by_session(session) is None)
        assert _call(p, session) == 200  # not refused: the session's next rollout
        second = p.state.rollouts.by_session(session)
        assert second is not None and second.rollout_id.startswith(f"session-{session}.")
        p.flush()
    phases = _phases(config.log_url, session)
    assert phases[:2] == [
        (f"session-{session}", RolloutPhase.STARTED, None),
        (f"session-{session}", RolloutPhase.FINISHED, "session idle for 1 s"),
    ]
    assert phases[2][:2] == (second.rollout_id, RolloutPhase.STARTED)
    events = read_events(config.log_url, group="calls", want=1)
    assert len(completions_of(events, f"session-{session}")) == 2
    assert len(completions_of(events, second.rollout_id)) == 1


def test_a_call_waiting_or_in_flight_keeps_its_session_open(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """A call held at the gate (a weight swap's pause) past the idle time still records into
    the session's rollout, which ends only once it has been idle after that call."""
    config = proxy_config(vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5)
    session = uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _call(p, session) == 200
        rollout = p.state.rollouts.by_session(session)
        assert httpx.post(f"{p.url}/admin/pause", headers=p.admin_headers).status_code == 200
        codes: list[int] = []
        held = threading.Thread(target=lambda: codes.append(_call(p, session)))
        held.start()
        time.sleep(2.0)  # four idle times, the call waiting all along
        assert p.state.rollouts.by_session(session) is rollout
        assert httpx.post(f"{p.url}/admin/resume", headers=p.admin_headers).status_code == 200
        held.join(60)
        assert codes == [200]
        _until("the session ends after its last call", lambda: p.state.rollouts.get(
            f"session-{session}") is None)  # fmt: skip
        p.flush()
    events = read_events(config.log_url, group="calls", want=1)
    assert len(completions_of(events, f"session-{session}")) == 2


def test_a_finished_session_goes_on_in_its_next_rollout(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, open_mode=True)  # idle: 30 min
    session = uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _call(p, session) == 200
        finish = f"{p.url}/admin/rollouts/session-{session}/finish"
        assert httpx.post(finish, headers=p.admin_headers, json={}).status_code == 200
        assert _call(p, session) == 200
        nxt = p.state.rollouts.by_session(session)
        assert nxt is not None and nxt.rollout_id != f"session-{session}"
        assert nxt.metadata == {"session": session}


def test_the_proxy_remembers_a_bounded_number_of_sessions(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """40 sessions of one call each, a memory of 10 finished rollouts: once they are idle,
    no session is live and 10 are remembered."""
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5,
        finished_rollouts=10,
    )  # fmt: skip
    with running_proxy(config) as p:
        for i in range(40):
            assert _call(p, f"s{i}-{uuid.uuid4().hex[:6]}") == 200
        _until("every session ends", lambda: len(p.state.rollouts) == 0)
        assert p.state.rollouts.finished_count == 10


def test_a_negative_idle_time_is_refused() -> None:
    with pytest.raises(ConfigError, match="session_idle_timeout"):
        ProxyConfig(upstream_url="http://x", open_mode=True, session_idle_timeout=-1)
