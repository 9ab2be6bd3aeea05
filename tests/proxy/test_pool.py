"""`openforge proxy --workers 2`: real worker processes behind the front, one local event log.

Rollouts registered through the front land on different workers and the answer names the
worker's URL; calls sent straight to each worker are recorded (two processes writing one
embedded log); a policy version, a pause and a resume set through the front reach both
workers; a call through the front's own address is forwarded to the owning worker. A worker
killed with SIGKILL is restarted by the pool on the same port and socket file and serves new
rollouts again."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from infra.proxy_client import Phase, ProxyAdmin, Reward
from openforge.stack import proxy_process
from openforge.testing import fast_upstream
from openforge.testing.proxy import completions_of, read_events
from openforge.threaded import serve_in_thread
from schemas.enums import CompletionStatus, RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_two_workers_share_the_rollouts_apply_the_admin_api_and_restart(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    log_url = f"local:{tmp_path / 'events'}"
    with (
        serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 4), "upstream") as up,
        proxy_process(
            up,
            model="fast",
            tokenizer=tiny_model_dir,
            log_url=log_url,
            out=tmp_path,
            extra_args=["--workers", "2"],
            unix_socket=tmp_path / "p.sock",
        ) as admin,
    ):
        run = uuid.uuid4().hex[:6]
        regs = [admin.register_rollout(f"pool-{run}-{i}", task_id="t") for i in range(4)]
        assert [r.worker for r in regs] == [0, 1, 0, 1]  # round robin
        urls = {r.base_url for r in regs}
        assert len(urls) == 2 and admin.url not in urls
        listed = httpx.get(f"{admin.url}/admin/workers", headers=_auth(admin.token)).json()
        assert [w["base_url"] for w in listed["workers"]] == [regs[0].base_url, regs[1].base_url]

        # Calls straight to each rollout's worker, with its key: no extra hop.
        for reg in regs[:2]:
            resp = httpx.post(
                f"{reg.base_url}{reg.openai_base_path}/chat/completions",
                json=CHAT,
                headers=_auth(reg.api_key),
                timeout=60,
            )
            assert resp.status_code == 200, resp.text
        # The other worker does not know the rollout: its state lives in its owner only.
        wrong = httpx.post(
            f"{regs[1].base_url}/v1/chat/completions", json=CHAT, headers=_auth(regs[0].api_key)
        )
        assert wrong.status_code == 401
        # Through the front's own address (by key): forwarded to the owner, streamed back.
        via_front = httpx.post(
            f"{admin.url}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers=_auth(regs[2].api_key),
            timeout=60,
        )
        assert via_front.status_code == 200 and "data: [DONE]" in via_front.text
        forwarded = httpx.get(f"{admin.url}/metrics").text  # the extra hop, counted
        assert (
            f'openforge_proxy_front_forwarded_total{{worker="{regs[2].worker}"}} 1.0' in forwarded
        )

        # The admin API reaches every worker.
        answer = admin.set_policy_version(7)
        assert answer["version"] == 7 and [w["version"] for w in answer["workers"]] == [7, 7]
        for url in sorted(urls):
            got = httpx.get(f"{url}/admin/policy", headers=_auth(admin.token)).json()
            assert got["version"] == 7
        paused = admin.pause(drain=1.0)
        assert paused["paused"] and paused["in_flight"] == 0 and len(paused["workers"]) == 2
        assert all(w["paused"] for w in paused["workers"])
        resumed = admin.resume()
        assert not resumed["paused"] and not any(w["paused"] for w in resumed["workers"])
        after = httpx.post(
            f"{regs[3].base_url}{regs[3].openai_base_path}/chat/completions",
            json=CHAT,
            headers=_auth(regs[3].api_key),
            timeout=60,
        )
        assert after.status_code == 200

        for reg in regs:  # the agent's end goes to the owner
            admin.finish_rollout(reg.rollout_id, exit_code=0)
        admin.post_reward(regs[0].rollout_id, 1.0)  # and so does a reward
        # Many phases in one request: each worker records its own rollouts' (a verified phase
        # with its reward), a rollout no worker has yet goes by hash.
        admin.record_phases(
            [Phase(r.rollout_id, RolloutPhase.VERIFIED, reward=Reward(0.25)) for r in regs[1:]]
            + [Phase(f"pool-{run}-queued", RolloutPhase.QUEUED, task_id="t")]
        )
        # A reward by the id of an answer goes to the owner of the rollout that id names.
        by_response = httpx.post(
            f"{admin.url}/responses/{after.json()['id']}/reward",
            json={"reward": 0.5, "verifier": "feedback"},
            headers=_auth(admin.token),
        )
        assert by_response.status_code == 201, by_response.text
        assert by_response.json()["rollout_id"] == regs[3].rollout_id
        health = admin.health()
        assert health["status"] == "ok" and len(health["workers"]) == 2
        assert health["finished_rollouts"] == 4

        # A worker killed with SIGKILL is restarted on its port and its socket file.
        workers = _workers(admin)
        socket_inode = Path(workers[1]["unix_socket"]).stat().st_ino
        os.kill(workers[1]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 90  # a restart imports torch again: slow on busy cores
        while not (_workers(admin)[1]["restarts"] == 1 and _healthy(admin)):
            assert time.monotonic() < deadline, "the killed worker was not restarted"
            time.sleep(0.2)
        again = _workers(admin)[1]
        assert again["pid"] != workers[1]["pid"]
        assert again["base_url"] == workers[1]["base_url"] == regs[1].base_url
        assert Path(again["unix_socket"]).stat().st_ino == socket_inode
        # Its rollouts' state went with it; a new rollout on it is served (TCP and socket).
        fresh = [admin.register_rollout(f"pool-{run}-n{i}") for i in range(2)][1]
        assert fresh.worker == 1 and fresh.base_url == regs[1].base_url
        served = httpx.post(
            f"{fresh.base_url}{fresh.openai_base_path}/chat/completions",
            json=CHAT,
            headers=_auth(fresh.api_key),
            timeout=60,
        )
        assert served.status_code == 200, served.text
        with httpx.Client(transport=httpx.HTTPTransport(uds=again["unix_socket"])) as uds:
            via_socket = uds.post(
                f"http://w1{fresh.openai_base_path}/chat/completions",
                json=CHAT,
                headers=_auth(fresh.api_key),
                timeout=60,
            )
        assert via_socket.status_code == 200, via_socket.text
        metrics = httpx.get(f"{admin.url}/metrics").text
        assert 'openforge_proxy_worker_restarts{worker="1"} 1.0' in metrics
        assert 'openforge_proxy_worker_up{worker="1"} 1.0' in metrics
    log_text = (tmp_path / "proxy.log").read_text()
    assert "exited with status -9" in log_text and "proxy worker 1 restarted" in log_text

    records = read_events(log_url, group=run, want=25)
    calls = {r.rollout_id: completions_of(records, r.rollout_id) for r in regs}
    assert [len(calls[r.rollout_id]) for r in regs] == [1, 1, 1, 1]
    assert all(c[0].status is CompletionStatus.OK for c in calls.values())
    versions = [calls[r.rollout_id][0].policy_versions[0].version for r in regs]
    assert versions == [0, 0, 0, 7]  # the last call came after the version reached its worker
    rewards = [r for r in records if isinstance(r, RewardEvent)]
    assert [sorted(w.reward for w in rewards if w.rollout_id == r.rollout_id) for r in regs] == [
        [1.0], [0.25], [0.25], [0.25, 0.5],  # the last also by the id of its answer
    ]  # fmt: skip
    phases = {(r.rollout_id, r.phase) for r in records if isinstance(r, RolloutEvent)}
    assert {(r.rollout_id, RolloutPhase.VERIFIED) for r in regs[1:]} <= phases
    assert (f"pool-{run}-queued", RolloutPhase.QUEUED) in phases


def _auth(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _workers(admin: ProxyAdmin) -> list[dict[str, Any]]:
    got = httpx.get(f"{admin.url}/admin/workers", headers=_auth(admin.token)).json()
    return list(got["workers"])


def _healthy(admin: ProxyAdmin) -> bool:
    # Longer than the front's 5 s per worker: a worker still starting behind its kept socket
    # accepts the connection and answers only when ready, so the front answers 503 after 5 s.
    return httpx.get(f"{admin.url}/health", timeout=20).status_code == 200
