"""The recorder on its own (:mod:`proxy.recorder`: a real publisher on a real local log), and the
admin routes that use it: each lifecycle change becomes one redacted record, and a caller waits
for its own record's receipt only. The one stand-in is an event-log writer that can be held
shut (:class:`tests.proxy.test_recording_faults.GatedWriter`)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openforge.testing import fast_upstream
from openforge.testing.proxy import proxy_config, running_proxy
from openforge.threaded import serve_in_thread
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher
from proxy.recorder import Recorder
from proxy.recording import now_us, rollout_event
from proxy.redaction import Redactor, build_patterns
from proxy.rollouts import RolloutRegistry
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent
from tests.proxy.test_recording_faults import GatedWriter, log_records

ADMIN = {"authorization": "Bearer adm"}
LEAK = "sk-abcdefghijklmnopqrstuvwx"  # an API key, by the default patterns
TOKEN = "hunter2hunter2"  # the recorder's own secret (the proxy's: its admin token)


@pytest.fixture
def gate() -> threading.Event:
    """Open: the log confirms what it is sent; shut: its flush waits (a stalled broker)."""
    gate = threading.Event()
    gate.set()
    return gate


@pytest.fixture
def publisher(tmp_path: Path, gate: threading.Event) -> Iterator[Publisher]:
    publisher = Publisher(lambda: GatedWriter(tmp_path / "events", gate), tmp_path / "spool")
    try:
        yield publisher
    finally:
        gate.set()
        publisher.close()


def _recorder(publisher: Publisher, metrics: ProxyMetrics, timeout: float = 30.0) -> Recorder:
    redactor = Redactor(build_patterns(), [TOKEN])
    return Recorder(publisher, redactor, metrics, record_timeout=timeout, record_bodies=True)


def test_each_lifecycle_change_is_one_redacted_record(publisher: Publisher, tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    recorder = _recorder(publisher, metrics)
    registry = RolloutRegistry()
    rollout = registry.create(
        "r1", mint_key=True, task_id="t", group_id="g", harness="h", metadata={"note": LEAK}
    )
    key = rollout.api_key or ""

    async def record() -> None:
        await recorder.durable(recorder.started(rollout))
        ended = recorder.ended(rollout, RolloutPhase.FAILED, exit_code=3, message=f"saw {key}")
        done = registry.finish(rollout, RolloutPhase.FAILED)
        await recorder.durable(ended)
        phase = rollout_event(
            "r1", RolloutPhase.VERIFIED, now_us(), task_id="t", message=f"{TOKEN}!"
        )
        await recorder.durable(recorder.many([(phase, done)]))
        reward = RewardEvent("rw-1", "r1", 1.0, 1, verifier_output=f"{key} {LEAK}")
        await recorder.durable(recorder.reward(reward, done))

    asyncio.run(record())
    started, failed, verified, reward = log_records(tmp_path / "events")
    assert isinstance(started, RolloutEvent) and started.event_id == "ro_r1_started"
    assert (started.at_us, started.task_id, started.group_id) == (rollout.created_us, "t", "g")
    assert started.backend is None and started.calls is None
    assert started.metadata == {"note": "[REDACTED:api_key]"}
    assert isinstance(failed, RolloutEvent) and failed.event_id == "ro_r1_failed"
    assert failed.exit_code == 3 and failed.calls == 0 and (failed.duration_s or 0) >= 0
    assert failed.message == "saw [REDACTED:secret]"  # the rollout's own key
    assert isinstance(verified, RolloutEvent) and verified.event_id == "ro_r1_verified"
    assert verified.message == "[REDACTED:secret]!" and verified.harness is None  # as given
    assert isinstance(reward, RewardEvent)
    assert reward.verifier_output == "[REDACTED:secret] [REDACTED:api_key]"
    counted = {"pattern": "api_key"}
    assert metrics.registry.get_sample_value("openforge_proxy_redactions_total", counted) == 3


def test_a_receipt_is_its_records_own(publisher: Publisher, gate: threading.Event) -> None:
    """While one record waits for the log, the receipt of a rollout that records nothing is
    resolved, and waiting for the pending one ends in a 503 after ``record_timeout``."""
    metrics = ProxyMetrics()
    recorder = _recorder(publisher, metrics, timeout=0.3)
    registry = RolloutRegistry()
    gate.clear()
    pending = recorder.started(registry.create("on", mint_key=False))
    quiet = recorder.started(registry.create("off", mint_key=False, record=False))
    assert quiet.done and not pending.done

    async def wait() -> None:
        await recorder.durable(quiet)
        with pytest.raises(ProxyError) as late:
            await recorder.durable(pending)
        assert (late.value.status, late.value.code) == (503, "not_recorded")
        gate.set()  # the log is back: the record arrives after all
        await asyncio.wait_for(pending.wait(30), 30)

    asyncio.run(wait())
    timeouts = {"error_class": "record_timeout"}
    assert metrics.registry.get_sample_value("openforge_proxy_errors_total", timeouts) == 1
    assert pending.done


def test_check_refuses_while_the_publisher_falls_behind(tmp_path: Path) -> None:
    gate = threading.Event()  # shut: the first batch stalls in the log's flush
    publisher = Publisher(
        lambda: GatedWriter(tmp_path / "events", gate), tmp_path / "spool", high_water=1
    )
    try:
        metrics = ProxyMetrics()
        recorder = _recorder(publisher, metrics)
        recorder.check()  # nothing pending yet
        registry = RolloutRegistry()
        deadline = time.monotonic() + 10
        while recorder.problem() is None and time.monotonic() < deadline:
            recorder.started(registry.create(f"r{len(registry)}", mint_key=False))
            time.sleep(0.05)
        with pytest.raises(ProxyError) as refused:
            recorder.check()
        assert (refused.value.status, refused.value.code) == (503, "recording_unavailable")
        assert "not keeping up" in refused.value.message and recorder.counts()["pending"] >= 1
        errors = {"error_class": "recording"}
        assert metrics.registry.get_sample_value("openforge_proxy_errors_total", errors) == 1
        gate.set()
        assert publisher.wait_idle(30)
        recorder.check()
        assert recorder.counts()["published"] == len(registry)
    finally:
        gate.set()
        publisher.close()


@pytest.fixture
def upstream(tiny_model_dir: Path) -> Iterator[str]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 2), "upstream") as url:
        yield url


def test_an_admin_route_waits_for_its_own_record_only(upstream: str, tmp_path: Path) -> None:
    """With one rollout's start stuck on its way to the log, a rollout that records nothing is
    registered and finished at once; the stuck one answers 503 after ``record_timeout``."""
    gate = threading.Event()
    gate.set()
    config = proxy_config(upstream, tmp_path, admin_token="adm", record_timeout=1.0)
    with running_proxy(config, open_log=lambda: GatedWriter(tmp_path / "events", gate)) as p:
        url = f"{p.url}/admin/rollouts"
        assert httpx.post(url, json={"rollout_id": "first"}, headers=ADMIN).status_code == 201
        gate.clear()
        stuck = httpx.post(url, json={"rollout_id": "stuck"}, headers=ADMIN, timeout=30)
        assert stuck.status_code == 503 and stuck.json()["error"]["code"] == "not_recorded"
        quiet = f"quiet-{uuid.uuid4().hex[:6]}"
        started = time.monotonic()
        body = {"rollout_id": quiet, "record": False}
        assert httpx.post(url, json=body, headers=ADMIN, timeout=30).status_code == 201
        finish = httpx.post(f"{url}/{quiet}/finish", headers=ADMIN, timeout=30)
        assert finish.status_code == 200 and finish.json()["phase"] == "finished"
        assert time.monotonic() - started < config.record_timeout  # neither waited on "stuck"
        gate.set()
        p.flush()
    ids = [getattr(r, "event_id", None) for r in log_records(tmp_path / "events")]
    assert ids == ["ro_first_started", "ro_stuck_started"]
