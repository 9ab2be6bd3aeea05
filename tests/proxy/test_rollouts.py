"""Rollouts: finished ones are evicted from the live maps, and only a bounded number of them is
remembered (for late rewards and clear refusals of late calls)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from proxy.rollouts import RolloutRegistry
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ADMIN = {"authorization": "Bearer adm"}


def test_finished_rollouts_are_evicted_and_remembered_up_to_the_bound() -> None:
    registry = RolloutRegistry(finished_capacity=3)
    rollouts = [registry.create(f"r{i}", mint_key=True, task_id=f"t{i}") for i in range(5)]
    live = registry.create("live", mint_key=True)
    for rollout in rollouts:
        registry.finish(rollout, RolloutPhase.FINISHED)
    assert len(registry) == 1 and registry.get("live") is live
    assert registry.by_key(live.api_key or "") is live
    assert registry.finished_count == 3
    for old in rollouts[:2]:  # the oldest are forgotten, with their keys
        assert registry.get(old.rollout_id) is None
        assert registry.by_key(old.api_key or "") is None
        assert registry.finished(old.rollout_id) is None
        assert registry.finished_by_key(old.api_key or "") is None
    for kept in rollouts[2:]:
        assert registry.get(kept.rollout_id) is None and registry.by_key(kept.api_key or "") is None
        done = registry.finished(kept.rollout_id)
        assert done is not None and done.task_id == kept.task_id
        assert registry.finished_by_key(kept.api_key or "") == done


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 4), "upstream") as url:
        tmp = Path(tmp_path_factory.mktemp("rollouts"))
        config = proxy_config(url, tmp, admin_token="adm", auto_register=True, finished_rollouts=2)
        with running_proxy(config) as p:
            yield p


def _register(p: RunningProxy, rollout_id: str) -> str:
    resp = httpx.post(
        f"{p.url}/admin/rollouts", json={"rollout_id": rollout_id, "task_id": "t"}, headers=ADMIN
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["api_key"])


def _finish(p: RunningProxy, rollout_id: str) -> httpx.Response:
    return httpx.post(f"{p.url}/admin/rollouts/{rollout_id}/finish", json={}, headers=ADMIN)


def test_after_finish_rewards_are_accepted_and_calls_refused(proxy: RunningProxy) -> None:
    """Rewards need the admin token, before and after the rollout ends; its own key never
    scores it (issue 12: reward integrity)."""
    rollout = f"f-{uuid.uuid4().hex[:6]}"
    key = _register(proxy, rollout)
    auth = {"authorization": f"Bearer {key}"}
    url = f"{proxy.url}/v1/chat/completions"
    assert httpx.post(url, json=CHAT, headers=auth, timeout=60).status_code == 200
    finished = _finish(proxy, rollout).json()
    # Its first call came after its registration: the harness's start, as the proxy saw it.
    assert 0 < finished["first_call_s"] < 60
    assert finished == {
        "rollout_id": rollout, "phase": "finished", "calls": 1,
        "first_call_s": finished["first_call_s"],
    }  # fmt: skip
    assert _finish(proxy, rollout).json() == finished  # idempotent: the same answer

    # The orchestrator posts the reward after the rollout ends, with the admin token; the
    # rollout's own key (all the agent holds) is refused.
    reward = httpx.post(f"{proxy.url}/rollout/{rollout}/reward", json={"reward": 1}, headers=auth)
    assert reward.status_code == 401
    assert reward.json()["error"]["code"] == "admin_token_required"
    reward = httpx.post(f"{proxy.url}/rollout/{rollout}/reward", json={"reward": 1}, headers=ADMIN)
    assert reward.status_code == 201
    # A late call gets a clear refusal, by key or by path (auto-register does not revive it).
    late = httpx.post(url, json=CHAT, headers=auth, timeout=60)
    assert late.status_code == 410 and late.json()["error"]["code"] == "rollout_finished"
    late = httpx.post(f"{proxy.url}/rollout/{rollout}/v1/chat/completions", json=CHAT)
    assert late.status_code == 410
    again = httpx.post(f"{proxy.url}/admin/rollouts", json={"rollout_id": rollout}, headers=ADMIN)
    assert again.status_code == 409
    health = httpx.get(f"{proxy.url}/health").json()
    assert health["rollouts"] == len(proxy.state.rollouts)

    proxy.flush()
    records = read_events(proxy.config.log_url, group=rollout, want=4)
    assert len(completions_of(records, rollout)) == 1
    (event,) = [r for r in records if isinstance(r, RewardEvent) and r.rollout_id == rollout]
    assert event.task_id == "t"  # attributed from the finished rollout

    # Two more finished rollouts push it out of the bounded memory; a reward is still taken
    # with the admin token (for a rollout the proxy no longer remembers, the task id is None).
    for other in (f"g-{uuid.uuid4().hex[:6]}", f"h-{uuid.uuid4().hex[:6]}"):
        _register(proxy, other)
        assert _finish(proxy, other).status_code == 200
    assert proxy.state.rollouts.finished_count == 2
    reward = httpx.post(f"{proxy.url}/rollout/{rollout}/reward", json={"reward": 1}, headers=auth)
    assert reward.status_code == 401
    reward = httpx.post(f"{proxy.url}/rollout/{rollout}/reward", json={"reward": 1}, headers=ADMIN)
    assert reward.status_code == 201
