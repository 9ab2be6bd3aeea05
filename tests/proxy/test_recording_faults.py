"""Recording under faults: poison records, over-size frames, an event log that stalls, a worker
error; and the admin pause that ends by itself. Real publisher, real local log, real proxy with
the fast vLLM-format upstream; the only stand-in is an event-log writer that can be held shut.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.eventlog import EventLogWriter
from infra.eventlog.local import LocalLog
from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from proxy.publisher import FRAME_MARGIN, Publisher
from schemas.codec import Record
from schemas.completion import CompletionEvent, SamplingParams, Timings
from schemas.enums import Dialect, RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES_HEADERS = {"anthropic-version": "2023-06-01"}
T0 = 1_796_000_000_000_000


def valid_records(rollout_id: str) -> list[Record]:
    return [
        RolloutEvent(f"ro-{uuid.uuid4().hex}", rollout_id, RolloutPhase.STARTED, T0),
        CompletionEvent(
            f"ev-{uuid.uuid4().hex}",
            rollout_id,
            0,
            Dialect.CHAT,
            False,
            "tiny",
            Timings(T0, T0 + 1, T0 + 2),
            sampling=SamplingParams(temperature=1.0, seed=3),
            prompt_token_ids=[1, 2],
            prompt_length=2,
            completion_token_ids=[3],
            completion_logprobs=[-0.5],
        ),
        RewardEvent(f"rw-{uuid.uuid4().hex}", rollout_id, 1.0, T0, verifier="unit"),
    ]


def poisoned(record: Record) -> Iterator[Record]:
    """One copy of ``record`` per field, that field holding what no schema takes."""
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        for poison in (object(), "\ud800", 2**64):
            yield dataclasses.replace(record, **{f.name: poison})  # type: ignore[type-var]


def log_records(root: Path) -> list[Record]:
    return read_events(f"local:{root}", group=f"g-{uuid.uuid4().hex[:6]}", want=10**9, timeout=2)


def test_poison_records_never_stop_recording(tmp_path: Path) -> None:
    """One poison per field of each record type, each between good records of its rollout (so
    they share frames): the good ones all arrive in order, the poison is dead-lettered."""
    log = tmp_path / "events"
    publisher = Publisher(lambda: LocalLog(log).writer(), tmp_path / "spool", retry_interval=0.2)
    good: list[Record] = []
    poisons = 0
    try:
        for template in valid_records("r-poison"):
            for bad in poisoned(template):
                ok = dataclasses.replace(template, event_id=f"good-{len(good)}")  # type: ignore[type-var]
                publisher.publish([bad, ok])
                good.append(ok)
                poisons += 1
        assert publisher.wait_idle(60)
        assert publisher.problem() is None
        stats = publisher.stats
        dead = publisher.dead_letters.read()
        assert stats.dead_lettered == len(dead) > 0
        assert all(d["reason"] for d in dead)
        # The poison that the codec takes anyway (schema_version is rewritten on encoding) is
        # recorded; everything else is in the dead-letter file; nothing is lost or duplicated.
        assert stats.published + stats.dead_lettered == len(good) + poisons
    finally:
        publisher.close()
    ids = [getattr(r, "event_id", None) for r in log_records(log)]
    assert [i for i in ids if isinstance(i, str) and i.startswith("good-")] == [
        r.event_id for r in good
    ]
    print(f"poison: {poisons} poisoned, {len(dead)} dead-lettered, {len(good)} good recorded")


def test_frames_over_the_logs_limit_are_split_or_dead_lettered(tmp_path: Path) -> None:
    log = tmp_path / "events"
    limit = FRAME_MARGIN + 4_000
    publisher = Publisher(
        lambda: LocalLog(log).writer(), tmp_path / "spool", max_message_bytes=limit
    )
    try:
        big = dataclasses.replace(valid_records("r-big")[1], request_body=secrets.token_hex(8_000))
        small = [
            dataclasses.replace(
                valid_records("r-small")[1], event_id=f"s{i}", response_body=secrets.token_hex(100)
            )
            for i in range(32)  # one frame of 32 would be over the limit, so it is split
        ]
        publisher.publish([big, *small])
        assert publisher.wait_idle(30)
        assert publisher.stats.dead_lettered == 1
        assert "over the event log's limit" in publisher.dead_letters.read()[0]["reason"]
    finally:
        publisher.close()
    assert [r.event_id for r in log_records(log)] == [f"s{i}" for i in range(32)]


class GatedWriter(EventLogWriter):
    """The local log's writer, whose flush waits while ``gate`` is shut (a stalled broker)."""

    def __init__(self, root: Path, gate: threading.Event) -> None:
        self._writer, self._gate = LocalLog(root).writer(), gate

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._writer.append(topic, key, value)

    def flush(self, timeout: float = 30.0) -> None:
        self._gate.wait()
        self._writer.flush(timeout)

    def close(self) -> None:
        self._writer.close()


@pytest.fixture
def upstream(tiny_model_dir: Path) -> Iterator[str]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 2), "upstream") as url:
        yield url


def test_calls_get_503_in_their_dialect_while_the_log_stalls_and_none_is_lost(
    upstream: str, tmp_path: Path
) -> None:
    gate = threading.Event()
    gate.set()
    config = proxy_config(
        upstream, tmp_path, auto_register=True, record_timeout=1.0, publish_high_water=3
    )
    log = tmp_path / "events"
    served: list[str] = []
    with running_proxy(config, open_log=lambda: GatedWriter(log, gate)) as p:
        url = f"{p.url}/rollout/stall/v1"
        for _ in range(3):
            resp = httpx.post(f"{url}/chat/completions", json=CHAT, timeout=30)
            assert resp.status_code == 200
            served.append(resp.json()["id"])
        gate.clear()  # the log stops confirming
        # The call in flight is not answered 200 unrecorded: 503 once its record is overdue.
        resp = httpx.post(f"{url}/messages", json=CHAT, headers=MESSAGES_HEADERS, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "overloaded_error"
        refused = 1
        deadline = time.monotonic() + 10
        while p.publisher.problem() is None and time.monotonic() < deadline:
            resp = httpx.post(f"{url}/chat/completions", json=CHAT, timeout=30)
            assert resp.status_code == 503
            refused += 1
        # Behind its high-water mark: calls refused at once, /health not ok.
        resp = httpx.post(f"{url}/chat/completions", json=CHAT, timeout=30)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "recording_unavailable"
        health = httpx.get(f"{p.url}/health")
        assert health.status_code == 503 and "not keeping up" in health.json()["problem"]
        gate.set()  # the log is back
        p.flush()
        assert httpx.get(f"{p.url}/health").status_code == 200
        resp = httpx.post(f"{url}/chat/completions", json=CHAT, timeout=30)
        assert resp.status_code == 200
        served.append(resp.json()["id"])
    recorded = [e for e in completions_of(log_records(log), "stall") if e.response_body is not None]
    recorded_ids = {json.loads(e.response_body)["id"] for e in recorded}
    assert set(served) <= recorded_ids
    # recorded > served: calls answered 503 because their record was late are recorded later.
    print(f"stall: served {len(served)}, recorded {len(recorded)}, refused {refused}, lost 0")


def test_a_reward_with_a_non_string_field_is_refused_and_recording_goes_on(
    upstream: str, tmp_path: Path
) -> None:
    """The issue's case, and its class: a poison record that reaches the publisher anyway."""
    config = proxy_config(upstream, tmp_path, auto_register=True)
    with running_proxy(config) as p:
        p.register("rw")
        bad = httpx.post(
            f"{p.url}/rollout/rw/reward", json={"reward": 1, "verifier": 7}, headers=p.admin_headers
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "verifier"
        p.publisher.publish([dataclasses.replace(valid_records("rw")[2], verifier=7)])
        for _ in range(20):
            resp = httpx.post(f"{p.url}/rollout/other/v1/chat/completions", json=CHAT, timeout=30)
            assert resp.status_code == 200
        health = httpx.get(f"{p.url}/health").json()
        assert health["status"] == "ok" and health["events"]["dead_lettered"] == 1
    events = completions_of(log_records(tmp_path / "events"), "other")
    assert [e.call_index for e in events] == list(range(20))


class FlakyWriter(GatedWriter):
    """Fails its first append with a bug (not an event-log error)."""

    failures = 1

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        if FlakyWriter.failures:
            FlakyWriter.failures -= 1
            raise RuntimeError("a bug in the writer")
        super().append(topic, key, value)


def test_a_worker_error_is_retried_and_the_worker_goes_on(tmp_path: Path) -> None:
    gate = threading.Event()
    gate.set()
    log = tmp_path / "events"
    publisher = Publisher(lambda: FlakyWriter(log, gate), tmp_path / "spool", retry_interval=0.2)
    try:
        publisher.publish(valid_records("r-flaky"))
        assert publisher.wait_idle(30)
        assert publisher.stats.worker_errors == 1 and publisher.stats.dead_lettered == 0
        assert publisher.problem() is None
    finally:
        publisher.close()
    assert len(log_records(log)) == 3


def test_a_pause_ends_by_itself_and_says_so(upstream: str, tmp_path: Path) -> None:
    config = proxy_config(upstream, tmp_path, auto_register=True, pause_mode="reject")
    with running_proxy(config) as p:
        admin = p.admin_headers
        paused = httpx.post(f"{p.url}/admin/pause", json={"timeout_s": 0.5}, headers=admin).json()
        assert paused["paused"] and 0 < paused["resumes_in_s"] <= 0.5
        resp = httpx.post(f"{p.url}/rollout/p/v1/chat/completions", json=CHAT, timeout=30)
        assert resp.status_code == 429
        time.sleep(0.8)
        state = httpx.get(f"{p.url}/admin/policy").json()
        assert not state["paused"] and state["auto_resumes"] == 1
        resp = httpx.post(f"{p.url}/rollout/p/v1/chat/completions", json=CHAT, timeout=30)
        assert resp.status_code == 200
        # A pause ended by /admin/resume does not count as timed out.
        assert httpx.post(f"{p.url}/admin/pause", headers=admin).json()["resumes_in_s"] > 200
        assert httpx.post(f"{p.url}/admin/resume", headers=admin).json()["auto_resumes"] == 1
        bad = httpx.post(f"{p.url}/admin/pause", json={"timeout_s": -1}, headers=admin)
        assert bad.status_code == 400 and not httpx.get(f"{p.url}/admin/policy").json()["paused"]


def test_admin_bodies_are_size_checked_in_the_dialect(upstream: str, tmp_path: Path) -> None:
    config = proxy_config(upstream, tmp_path, auto_register=True, max_admin_body_bytes=1024)
    with running_proxy(config) as p:
        big = {"rollout_id": "big", "metadata": {"x": "y" * 2048}}
        resp = httpx.post(f"{p.url}/admin/rollouts", json=big, headers=p.admin_headers)
        assert resp.status_code == 413 and "1024-byte limit" in resp.json()["error"]["message"]
        resp = httpx.post(
            f"{p.url}/admin/rollouts",
            json=big,
            headers={**p.admin_headers, **MESSAGES_HEADERS},
        )
        assert resp.status_code == 413 and resp.json()["error"]["type"] == "request_too_large"
        # A call's body still gets the call limit.
        long = {**CHAT, "messages": [{"role": "user", "content": "z" * 4096}]}
        resp = httpx.post(f"{p.url}/rollout/b/v1/chat/completions", json=long, timeout=30)
        assert resp.status_code == 200


def test_a_client_that_sends_its_body_too_slowly_is_cut_off(upstream: str, tmp_path: Path) -> None:
    config = proxy_config(upstream, tmp_path, auto_register=True, body_timeout=0.5)
    with running_proxy(config) as p:
        host, port = p.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(
                b"POST /rollout/slow/v1/messages HTTP/1.1\r\nhost: x\r\n"
                b'anthropic-version: 2023-06-01\r\ncontent-length: 100\r\n\r\n{"model"'
            )  # and nothing more
            started = time.monotonic()
            answer = conn.recv(65536).decode()
        assert time.monotonic() - started < 5
        head, _, body = answer.partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 408")
        assert json.loads(body)["error"]["type"] == "timeout_error"


class _CountingWriter(EventLogWriter):
    """The real local log's writer, counting its flushes and what each made durable (the
    fsync takes a few ms more than here, so that calls arrive while one is in progress)."""

    def __init__(self, root: Path) -> None:
        self.inner = LocalLog(root).writer()
        self.flushes = 0
        self.appended: list[bytes] = []
        self.durable: set[bytes] = set()

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.inner.append(topic, key, value)
        self.appended.append(key or b"")

    def flush(self, timeout: float = 30.0) -> None:
        time.sleep(0.02)
        self.inner.flush(timeout)
        self.flushes += 1
        self.durable.update(self.appended)
        self.appended.clear()

    def close(self) -> None:
        self.inner.close()


def test_concurrent_calls_share_one_fsync_and_each_waits_for_its_own(tmp_path: Path) -> None:
    """Group commit: 64 calls' records published at once from 64 threads take a few fsyncs, not
    64, and no receipt resolves before the fsync that made its record durable."""
    writer = _CountingWriter(tmp_path / "events")
    publisher = Publisher(lambda: writer, tmp_path / "spool", retry_interval=0.2)
    early: list[str] = []

    def call(i: int) -> None:
        record = valid_records(f"r{i}")[1]
        receipt = publisher.publish([record])
        assert asyncio.run(receipt.wait(30))
        if record.rollout_id.encode() not in writer.durable:  # flushes sleep 20 ms first
            early.append(record.rollout_id)

    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        publisher.close()
    assert early == []
    assert writer.durable == {f"r{i}".encode() for i in range(64)}
    assert 1 <= writer.flushes <= 16, writer.flushes
    assert len(log_records(tmp_path / "events")) == 64
