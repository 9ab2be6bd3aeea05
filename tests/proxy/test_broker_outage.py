"""A Kafka outage under load: the broker is stopped for 12 s under 16 concurrent streaming
clients, then restarted on its data. Every request succeeds (records wait in the proxy's spool),
and afterwards Kafka holds exactly the served calls, deduplicated by event id, in call order per
rollout."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from infra.local.kafka import KafkaBroker
from openforge.testing import fast_upstream
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from openforge.threaded import serve_in_thread
from schemas.completion import CompletionEvent

CLIENTS = 16
OUTAGE_S = 12.0  # over twice the publisher's flush timeout: batches go to the spool
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _client(url: str, n: int, stop: threading.Event, served: list[str], failed: list[str]) -> None:
    """Streamed calls until ``stop``; one is served when its stream ended with ``[DONE]``."""
    body = {**CHAT, "stream": True}
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            try:
                with client.stream(
                    "POST", f"{url}/rollout/o{n}/v1/chat/completions", json=body
                ) as resp:
                    text = b"".join(resp.iter_bytes()).decode()
            except httpx.HTTPError as exc:
                failed.append(f"o{n}: {exc!r}")
                continue
            if resp.status_code == 200 and text.endswith("data: [DONE]\n\n"):
                served.append(json.loads(text.split("data: ", 2)[1])["id"])
            else:
                failed.append(f"o{n}: {resp.status_code} {text[:200]}")


def test_a_broker_outage_under_load_fails_no_call_and_loses_none(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "kafka"
    broker = KafkaBroker(data_dir=data)
    broker.start()
    port = broker.port
    app = fast_upstream.create_app(str(tiny_model_dir), 8, token_delay=0.002)
    try:
        with serve_in_thread(app, "upstream") as upstream:
            config = proxy_config(upstream, tmp_path, log_url=broker.url, auto_register=True)
            with running_proxy(config) as p:
                stop = threading.Event()
                served: list[str] = []
                failed: list[str] = []
                clients = [
                    threading.Thread(target=_client, args=(p.url, n, stop, served, failed))
                    for n in range(CLIENTS)
                ]
                for c in clients:
                    c.start()
                time.sleep(5)
                before = len(served)
                broker.stop()  # the data directory is ours: kept for the restart
                time.sleep(OUTAGE_S)
                during = len(served) - before
                broker = KafkaBroker(data_dir=data, port=port)
                broker.start()
                time.sleep(10)
                stop.set()
                for c in clients:
                    c.join(120)
                p.flush()
                stats = p.publisher.stats
                total = len(served)
                records = read_events(broker.url, group="outage", want=total, timeout=120)
        events: dict[str, CompletionEvent] = {}
        order: dict[str, list[int]] = {}
        for r in records:
            if isinstance(r, CompletionEvent) and r.event_id not in events:
                events[r.event_id] = r
                order.setdefault(r.rollout_id, []).append(r.call_index)
        recorded = {json.loads(e.response_body)["id"] for e in events.values() if e.response_body}
        duplicates = sum(isinstance(r, CompletionEvent) for r in records) - len(events)
        print(
            f"outage: served {total} ({during} during the outage), recorded {len(recorded)}, "
            f"lost {len(set(served) - recorded)}, duplicate deliveries {duplicates}, "
            f"spooled {stats.spooled}, replayed frames {stats.replayed_frames}"
        )
        assert not failed, failed[:5]
        assert during > 0  # calls were served while the broker was down
        assert stats.spooled > 0 and stats.replayed_frames > 0
        assert recorded == set(served)  # exactly the served calls: none lost, none extra
        for rollout, indices in order.items():
            assert indices == sorted(indices), rollout  # in call order per rollout
            assert indices == list(range(len(indices))), rollout
    finally:
        broker.stop()
