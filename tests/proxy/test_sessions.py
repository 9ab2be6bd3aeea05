"""Open-mode sessions on a real proxy in front of real vLLM: a session's rollout ends after an
idle time or an explicit finish, its next call starts its next rollout (never a refusal), a
call waiting or in flight keeps it open, and the proxy's memory of sessions stays bounded."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
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
from openforge.traffic.dialects import PATHS, Dialect, headers, request
from proxy.config import ProxyConfig
from proxy.pool import WorkerPool
from proxy.sessions import NEW_SESSION
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
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


def _client_call(p: RunningProxy, session: str, client: str) -> int:
    headers = {"session-id": session, "authorization": f"Bearer {client}"}
    url = f"{p.url}/v1/chat/completions"
    return httpx.post(url, json=CHAT, headers=headers, timeout=60).status_code


def test_a_new_session_of_a_client_ends_its_previous_idle_one(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """By ``authorization``: client A's second session ends its first (recorded before the
    second starts); client B's session is not A's to end; A's first session coming back starts
    its next rollout and ends A's second; a session with a call in flight is left to the idle
    sweep; and the clients are remembered only while their session is live, hashed."""
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=1.0,
        session_client_header="Authorization",
    )  # fmt: skip
    a1, a2, b1 = (f"{n}-{uuid.uuid4().hex[:6]}" for n in ("a1", "a2", "b1"))
    with running_proxy(config) as p:
        assert _client_call(p, a1, "key-a") == 200 and _client_call(p, b1, "key-b") == 200
        assert _client_call(p, a2, "key-a") == 200
        assert p.state.rollouts.by_session(a1) is None  # ended by A's new session
        assert p.state.rollouts.by_session(b1) is not None  # B's own
        assert _client_call(p, a1, "key-a") == 200  # A back on its first session
        again = p.state.rollouts.by_session(a1)
        assert again is not None and again.rollout_id.startswith(f"session-{a1}.")
        assert p.state.rollouts.by_session(a2) is None
        assert "key-a" not in repr(p.state.clients.__dict__)  # hashed
        _until("every session idle", lambda: len(p.state.rollouts) == 0)
        _until("the clients forgotten", lambda: len(p.state.clients) == 0, timeout=3)
        p.flush()
    ends = {(rid, msg) for rid, phase, msg in _phases(config.log_url, a1) + _phases(
        config.log_url, a2) if phase is RolloutPhase.FINISHED}  # fmt: skip
    assert (f"session-{a1}", NEW_SESSION) in ends and (f"session-{a2}", NEW_SESSION) in ends
    assert (again.rollout_id, "session idle for 1 s") in ends
    order = [(r.rollout_id, r.phase) for r in read_events(config.log_url, group="o", want=1)
             if isinstance(r, RolloutEvent)]  # fmt: skip
    assert order.index((f"session-{a1}", RolloutPhase.FINISHED)) < order.index(
        (f"session-{a2}", RolloutPhase.STARTED)
    )


def test_a_session_with_a_call_waiting_is_not_ended_by_its_clients_next(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_client_header="authorization"
    )  # fmt: skip
    first, second = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _client_call(p, first, "k") == 200
        rollout = p.state.rollouts.by_session(first)
        assert httpx.post(f"{p.url}/admin/pause", headers=p.admin_headers).status_code == 200
        codes: list[int] = []
        held = threading.Thread(target=lambda: codes.append(_client_call(p, first, "k")))
        held.start()
        _until("the call waits at the gate", lambda: rollout is not None and rollout.idle_for(
            time.monotonic()) == 0)  # fmt: skip
        nxt = threading.Thread(target=lambda: codes.append(_client_call(p, second, "k")))
        nxt.start()
        _until("the second session starts", lambda: p.state.rollouts.by_session(second))
        assert p.state.rollouts.by_session(first) is rollout  # still live: a call of it waits
        assert httpx.post(f"{p.url}/admin/resume", headers=p.admin_headers).status_code == 200
        held.join(60)
        nxt.join(60)
        assert codes == [200, 200]
    events = read_events(config.log_url, group="calls", want=1)
    assert len(completions_of(events, f"session-{first}")) == 2


def test_the_client_header_needs_open_mode_and_one_worker(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="open mode"):
        ProxyConfig(upstream_url="http://x", session_client_header="authorization")
    config = ProxyConfig(upstream_url="http://x", open_mode=True, session_client_header="a")
    with pytest.raises(ConfigError, match="--workers 1"):
        WorkerPool(config, 2, "127.0.0.1", None, None)


def test_a_negative_idle_time_is_refused() -> None:
    with pytest.raises(ConfigError, match="session_idle_timeout"):
        ProxyConfig(upstream_url="http://x", open_mode=True, session_idle_timeout=-1)


def test_feedback_comes_late_by_session_with_a_credential_that_can_do_nothing_else(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """A person's thumbs up posted with the feedback token after the session went idle lands on
    the session's last rollout; that token cannot register, finish, pause or set the policy,
    and no token at all cannot post."""
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5,
        feedback_token="fb-secret",
    )  # fmt: skip
    session = uuid.uuid4().hex[:8]
    feedback = {"authorization": "Bearer fb-secret"}
    thumbs = {"reward": 1.0, "components": {"thumbs": 1.0}}
    with running_proxy(config) as p:
        assert _call(p, session) == 200
        _until("the idle session ends", lambda: p.state.rollouts.by_session(session) is None)
        resp = httpx.post(f"{p.url}/sessions/{session}/reward", json=thumbs, headers=feedback)
        assert resp.status_code == 201 and resp.json()["rollout_id"] == f"session-{session}"
        by_id = httpx.post(
            f"{p.url}/rollout/session-{session}/reward",
            json={"reward": 0.0, "components": {"ci": 0.0}, "verifier": "ci"},
            headers=feedback,
        )
        assert by_id.status_code == 201
        assert httpx.post(f"{p.url}/sessions/{session}/reward", json=thumbs).status_code == 401
        unknown = httpx.post(f"{p.url}/sessions/nobody/reward", json=thumbs, headers=feedback)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "session_not_found"
        for path, body in [
            ("/admin/rollouts", {"rollout_id": "x"}),
            (f"/admin/rollouts/session-{session}/finish", {}),
            ("/admin/pause", {}),
            ("/admin/policy", {"version": 9}),
        ]:
            assert httpx.post(f"{p.url}{path}", json=body, headers=feedback).status_code == 401
        p.flush()
    rewards = [
        r for r in read_events(config.log_url, group="fb", want=1) if isinstance(r, RewardEvent)
    ]
    assert [(r.rollout_id, r.components, r.verifier) for r in rewards] == [
        (f"session-{session}", {"thumbs": 1.0}, "feedback"),
        (f"session-{session}", {"ci": 0.0}, "ci"),
    ]


def test_feedback_comes_by_response_id_in_each_dialect_long_after_the_session(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """The id of each answer (chatcmpl-, resp_, msg_) names its rollout: feedback posted by it,
    after the session ended and was forgotten (a memory of no finished rollout), lands on that
    rollout; an id the proxy did not make is a 404 that says what to post instead."""
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5,
        feedback_token="fb-secret", finished_rollouts=0,
    )  # fmt: skip
    feedback = {"authorization": "Bearer fb-secret"}
    sessions = {d: f"{d.value}-{uuid.uuid4().hex[:6]}" for d in Dialect}
    with running_proxy(config) as p:
        ids = {}
        for dialect, session in sessions.items():
            body = request(dialect, [("user", "Say hi.")], 4)
            answer = httpx.post(
                p.url + PATHS[dialect], json=body, headers=headers(dialect, session), timeout=60
            )
            assert answer.status_code == 200, answer.text
            ids[dialect] = answer.json()["id"]
        _until("every session ends", lambda: len(p.state.rollouts) == 0)
        for dialect, rid in ids.items():
            assert rid.startswith(("chatcmpl-", "resp_", "msg_"))
            resp = httpx.post(
                f"{p.url}/responses/{rid}/reward", json={"reward": 1}, headers=feedback
            )
            assert resp.status_code == 201, resp.text
            assert resp.json()["rollout_id"] == f"session-{sessions[dialect]}"
        for bad in ("chatcmpl-123", "resp_!!!!", "nothing"):
            resp = httpx.post(
                f"{p.url}/responses/{bad}/reward", json={"reward": 1}, headers=feedback
            )
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "response_not_found"
        assert (
            httpx.post(
                f"{p.url}/responses/{ids[Dialect.CHAT]}/reward", json={"reward": 1}
            ).status_code
            == 401
        )
        p.flush()
    rewards = [
        r for r in read_events(config.log_url, group="rid", want=1) if isinstance(r, RewardEvent)
    ]
    assert sorted((r.rollout_id, r.verifier) for r in rewards) == sorted(
        (f"session-{s}", "feedback") for s in sessions.values()
    )


def test_the_feedback_token_must_be_a_secret_of_its_own() -> None:
    for token in ("ofk_abc", "same"):
        with pytest.raises(ConfigError, match="feedback token"):
            ProxyConfig(upstream_url="http://x", admin_token="same", feedback_token=token)


def test_a_call_whose_body_arrives_after_its_session_ended_records_into_the_next_rollout(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5)
    session = uuid.uuid4().hex[:8]
    raw = json.dumps(CHAT).encode()

    def slow_body() -> Iterator[bytes]:
        yield raw[:10]
        time.sleep(1.5)  # the session goes idle and ends meanwhile
        yield raw[10:]

    with running_proxy(config) as p:
        assert _call(p, session) == 200
        resp = httpx.post(
            f"{p.url}/v1/chat/completions",
            content=slow_body(),
            headers={"session-id": session, "content-type": "application/json"},
            timeout=60,
        )
        assert resp.status_code == 200
        nxt = p.state.rollouts.by_session(session)
        assert nxt is not None and nxt.rollout_id != f"session-{session}"
        p.flush()
    events = read_events(config.log_url, group="calls", want=1)
    assert len(completions_of(events, f"session-{session}")) == 1
    assert len(completions_of(events, nxt.rollout_id)) == 1
