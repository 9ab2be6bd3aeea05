"""Publishing: events reach a real Kafka broker; while it is down they wait in the spool, in
order."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx

from infra.local.kafka import KafkaBroker
from infra.local.process import free_port
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_events_land_in_kafka_and_decode(
    vllm_server: VLLMServer, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, log_url=kafka_broker.url)
    rollout = f"k-{uuid.uuid4().hex[:6]}"
    with running_proxy(config) as p:
        key = p.register(rollout, task_id="task-7", harness="test")["api_key"]
        for _ in range(3):
            resp = httpx.post(
                f"{p.url}/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert resp.status_code == 200
        assert (
            httpx.post(
                f"{p.url}/rollout/{rollout}/reward",
                json={"reward": 0.5, "components": {"tests": 0.5}, "verifier": "unit"},
                headers=p.admin_headers,
            ).status_code
            == 201
        )
        assert (
            httpx.post(
                f"{p.url}/admin/rollouts/{rollout}/finish",
                json={"exit_code": 0},
                headers=p.admin_headers,
            ).status_code
            == 200
        )
        p.flush()
        assert p.publisher.stats.spooled == 0
    records = [
        r for r in read_events(kafka_broker.url, group=rollout, want=6) if r.rollout_id == rollout
    ]
    kinds = [type(r).__name__ for r in records]
    assert kinds == [
        "RolloutEvent",
        "CompletionEvent",
        "CompletionEvent",
        "CompletionEvent",
        "RewardEvent",
        "RolloutEvent",
    ]
    assert [e.call_index for e in completions_of(records)] == [0, 1, 2]
    assert all(e.task_id == "task-7" and e.harness == "test" for e in completions_of(records))
    reward = records[4]
    assert (
        isinstance(reward, RewardEvent)
        and reward.reward == 0.5
        and reward.components == {"tests": 0.5}
    )
    end = records[5]
    assert (
        isinstance(end, RolloutEvent) and end.phase is RolloutPhase.FINISHED and end.exit_code == 0
    )


def test_events_spool_while_kafka_is_down_and_arrive_in_order(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    port = free_port()
    config = proxy_config(
        vllm_server.base_url, tmp_path, log_url=f"kafka://127.0.0.1:{port}", auto_register=True
    )
    rollout = f"s-{uuid.uuid4().hex[:6]}"
    with running_proxy(config) as p:
        p.publisher._retry_interval = 0.5
        for _ in range(5):
            resp = httpx.post(
                f"{p.url}/rollout/{rollout}/v1/chat/completions", json=CHAT, timeout=60
            )
            assert resp.status_code == 200  # the harness never notices the log is down
        p.flush()
        assert p.publisher.stats.spooled == 6  # rollout started + 5 completions
        with KafkaBroker(port=port) as broker:
            records = read_events(broker.url, group="after", want=6, timeout=60)
            events = completions_of(records, rollout)
            assert [e.call_index for e in events] == [0, 1, 2, 3, 4]
            assert isinstance(records[0], RolloutEvent)
            assert p.publisher.stats.replayed_frames >= 1
            resp = httpx.post(
                f"{p.url}/rollout/{rollout}/v1/chat/completions", json=CHAT, timeout=60
            )
            p.flush()
            later = completions_of(
                read_events(broker.url, group="after2", want=7, timeout=60), rollout
            )
            assert [e.call_index for e in later] == [0, 1, 2, 3, 4, 5]
