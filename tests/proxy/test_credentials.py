"""Reward integrity: the proxy always has an admin credential, and a rollout's key (all an agent
holds) only makes completions. Also the orchestrator's lifecycle phases and the Unix socket that
sandboxes reach the proxy through."""

from __future__ import annotations

import json
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.proxy_client import Phase, Reward
from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RETRIED, RolloutEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 4), "upstream") as url:
        tmp = Path(tmp_path_factory.mktemp("credentials"))
        config = proxy_config(url, tmp)  # no admin token given: one is generated
        with running_proxy(config, unix_socket=tmp / "proxy.sock") as p:
            yield p


def test_a_generated_admin_token_is_written_for_its_owner_only(proxy: RunningProxy) -> None:
    path = proxy.config.spool_dir.parent / "proxy-admin-token"
    token = path.read_text()
    assert token == proxy.config.admin_token and token.startswith("ofa_") and len(token) > 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Admin routes are closed without it.
    assert httpx.post(f"{proxy.url}/admin/rollouts", json={}).status_code == 401
    assert httpx.post(f"{proxy.url}/admin/pause").status_code == 401


def test_a_rollout_key_makes_completions_and_nothing_else(proxy: RunningProxy) -> None:
    rollout = f"k-{uuid.uuid4().hex[:6]}"
    key = proxy.register(rollout)["api_key"]
    auth = {"authorization": f"Bearer {key}"}
    assert httpx.post(f"{proxy.url}/v1/chat/completions", json=CHAT, headers=auth).status_code
    for path, body in [
        (f"/rollout/{rollout}/reward", {"reward": 1.0}),
        (f"/admin/rollouts/{rollout}/finish", {"exit_code": 0}),
        (f"/admin/rollouts/{rollout}/phase", {"phase": "verified"}),
        ("/admin/rollouts", {"rollout_id": f"{rollout}-2"}),
        ("/admin/policy", {"version": 9}),
        ("/admin/pause", {}),
    ]:
        resp = httpx.post(f"{proxy.url}{path}", json=body, headers=auth)
        assert resp.status_code == 401, (path, resp.text)
        assert resp.json()["error"]["code"] == "admin_token_required"
    admin = proxy.admin
    admin.post_reward(rollout, 1.0, components={"tests": 1.0}, verifier="unit")
    admin.finish_rollout(rollout, exit_code=0)


@pytest.mark.parametrize(
    "body",
    [
        {"reward": float("nan")},
        {"reward": "1"},
        {"reward": True},
        {"reward": 10**400},
        {"reward": 1.0, "components": {"tests": float("inf")}},
        {"reward": 1.0, "verifier": 7},
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_a_400(proxy: RunningProxy, body: object) -> None:
    rollout = f"n-{uuid.uuid4().hex[:6]}"
    proxy.register(rollout)
    # json.dumps writes NaN and Infinity, as a careless client would.
    resp = httpx.post(
        f"{proxy.url}/rollout/{rollout}/reward",
        content=json.dumps(body),
        headers={**proxy.admin_headers, "content-type": "application/json"},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_orchestrator_phases_are_recorded(proxy: RunningProxy) -> None:
    queued, broken = f"q-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    admin = proxy.admin
    admin.record_phase(queued, RolloutPhase.QUEUED, task_id="t1", group_id="g1")
    proxy.register(queued, task_id="t1", group_id="g1")
    admin.finish_rollout(queued, exit_code=0)
    costs = {"agent_s": 1.5, "agent_cpu_s": 0.25, "wall_s": 2.0}
    scored = Reward(0.5, {"tests": 0.5}, "t1@1", "1 of 2 passed")  # with its phase, one write
    reward_id = admin.record_phase(
        queued, RolloutPhase.VERIFIED, message="reward.txt", costs=costs, reward=scored
    )
    assert reward_id is not None and reward_id.startswith("rw_")
    proxy.register(broken, task_id="t2", metadata={"attempt": "1"})
    admin.record_phase(
        broken,
        RolloutPhase.INFRA_FAILED,
        message="sandbox did not start",
        metadata={RETRIED: "true"},  # a new attempt plays it again
    )
    assert proxy.state.rollouts.get(broken) is None  # evicted like a finished rollout
    bad = httpx.post(
        f"{proxy.url}/admin/rollouts/{queued}/phase",
        json={"phase": "finished"},
        headers=proxy.admin_headers,
    )
    assert bad.status_code == 400 and "queued, verified, infra_failed" in bad.text
    for costs_body, said in (
        ({"tokens": 3}, "'costs' has 'tokens'; known: queued_s, prepare_s"),
        ({"agent_s": -1}, "'costs.agent_s' must be a finite number >= 0"),
        ({"agent_s": "1"}, "'costs.agent_s' must be a finite number >= 0"),
        ([1], "'costs' must be an object of queued_s"),
    ):
        refused = httpx.post(
            f"{proxy.url}/admin/rollouts/{queued}/phase",
            json={"phase": "verified", "costs": costs_body},
            headers=proxy.admin_headers,
        )
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], said
    # A reward rides only on a verified phase; a batch holds only queued and verified
    # phases, and a bad one refuses the whole batch (nothing of it is recorded).
    for path, body, said in (
        (f"{queued}/phase", {"phase": "queued", "reward": {"reward": 1}}, "'reward' rides only"),
        (f"{queued}/phase", {"phase": "verified", "reward": {"reward": "1"}}, "'reward.reward'"),
        ("phases", {"phases": {}}, "'phases' must be a list of objects"),
        ("phases", {"phases": [{"phase": "queued"}]}, "'phases[0].rollout_id' is missing"),
        (
            "phases",
            {"phases": [{"rollout_id": "never", "phase": "queued"},
                        {"rollout_id": "never", "phase": "infra_failed"}]},
            "'phases[1].phase' must be one of queued, verified",
        ),
    ):  # fmt: skip
        refused = httpx.post(
            f"{proxy.url}/admin/rollouts/{path}", json=body, headers=proxy.admin_headers
        )
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], said
    batched = [f"m-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    admin.record_phases([Phase(r, RolloutPhase.QUEUED, task_id="t3") for r in batched])
    proxy.flush()
    records = read_events(proxy.config.log_url, group=queued, want=10)
    events = [r for r in records if isinstance(r, RolloutEvent)]
    assert "never" not in {r.rollout_id for r in events}
    assert {r.rollout_id for r in events if r.task_id == "t3"} == set(batched)
    (rewarded,) = [r for r in records if isinstance(r, RewardEvent) and r.rollout_id == queued]
    assert rewarded.event_id == reward_id and rewarded.components == {"tests": 0.5}
    assert (rewarded.reward, rewarded.verifier, rewarded.task_id) == (0.5, "t1@1", "t1")
    assert rewarded.verifier_output == "1 of 2 passed"
    phases = {
        (r.rollout_id, r.phase): r
        for r in records
        if isinstance(r, RolloutEvent) and r.rollout_id in (queued, broken)
    }
    assert set(phases) == {
        (queued, RolloutPhase.QUEUED),
        (queued, RolloutPhase.STARTED),
        (queued, RolloutPhase.FINISHED),
        (queued, RolloutPhase.VERIFIED),
        (broken, RolloutPhase.STARTED),
        (broken, RolloutPhase.INFRA_FAILED),
    }
    assert phases[(queued, RolloutPhase.QUEUED)].group_id == "g1"
    assert phases[(queued, RolloutPhase.VERIFIED)].task_id == "t1"
    assert phases[(queued, RolloutPhase.VERIFIED)].costs == costs
    assert phases[(queued, RolloutPhase.QUEUED)].costs == {}
    assert phases[(broken, RolloutPhase.INFRA_FAILED)].message == "sandbox did not start"
    # The live rollout's end keeps its own metadata and adds the orchestrator's.
    assert phases[(broken, RolloutPhase.INFRA_FAILED)].metadata == {"attempt": "1", RETRIED: "true"}


def test_the_unix_socket_serves_the_same_proxy(proxy: RunningProxy) -> None:
    assert proxy.unix_socket is not None
    transport = httpx.HTTPTransport(uds=str(proxy.unix_socket))
    with httpx.Client(transport=transport, base_url="http://proxy") as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        rollout = f"u-{uuid.uuid4().hex[:6]}"
        proxy.register(rollout)
        resp = client.post(f"/rollout/{rollout}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]


def test_an_idle_kept_alive_connection_outlives_a_client_idle_timeout(proxy: RunningProxy) -> None:
    """A client (httpx: 5 s) sends on a pooled connection it kept idle: the proxy has not
    closed it under the request (at uvicorn's default 5 s both sides timed out together, and an
    orchestrator's registration failed with "Server disconnected without sending a response")."""
    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        for _ in range(2):
            conn.sendall(request)
            assert conn.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(6)  # idle past the clients' 5 s, on the same connection
