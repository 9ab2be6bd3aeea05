"""The gate on its own (:mod:`proxy.gate`, in one event loop, no app): slots, the pause in both
modes, a pause that ends by itself, and draining."""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import PauseMode
from proxy.errors import ProxyError
from proxy.gate import Gate
from proxy.metrics import ProxyMetrics


def _sample(metrics: ProxyMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_slots_are_taken_up_to_the_limit_and_given_back() -> None:
    async def scenario() -> None:
        metrics = ProxyMetrics()
        gate = Gate(2, PauseMode.WAIT, 1, metrics)
        await gate.admit()
        await gate.admit()
        assert gate.in_flight == 2 and _sample(metrics, "openforge_proxy_in_flight") == 2
        with pytest.raises(ProxyError) as refused:
            await gate.admit()
        assert refused.value.status == 429 and refused.value.code == "concurrency_limit"
        assert refused.value.retry_after == "1"
        errors = {"error_class": "concurrency"}
        assert _sample(metrics, "openforge_proxy_errors_total", **errors) == 1
        gate.release()
        await gate.admit()  # a slot given back is taken again
        gate.release()
        gate.release()
        assert gate.in_flight == 0 and _sample(metrics, "openforge_proxy_in_flight") == 0
        assert await gate.drain(1.0)  # not paused: whether no call holds a slot

    asyncio.run(scenario())


def test_a_pause_refuses_in_reject_mode_and_holds_in_wait_mode() -> None:
    async def scenario() -> None:
        reject = Gate(8, PauseMode.REJECT, 7, ProxyMetrics())
        reject.pause(60)
        with pytest.raises(ProxyError) as refused:
            await reject.admit()
        assert (refused.value.status, refused.value.code) == (429, "paused")
        assert refused.value.retry_after == "7" and reject.in_flight == 0
        reject.unpause()
        await reject.admit()
        assert reject.in_flight == 1

        wait = Gate(8, PauseMode.WAIT, 1, ProxyMetrics())
        wait.pause(60)
        held = asyncio.create_task(wait.admit())
        await asyncio.sleep(0.05)
        assert not held.done() and wait.in_flight == 0  # held at the gate: no slot
        wait.unpause()
        await asyncio.wait_for(held, 1)
        assert wait.in_flight == 1 and not wait.paused and wait.resumes_in() is None

    asyncio.run(scenario())


def test_a_pause_ends_by_itself_and_says_so() -> None:
    async def scenario() -> None:
        metrics = ProxyMetrics()
        gate = Gate(8, PauseMode.WAIT, 1, metrics)
        gate.pause(0.2)
        left = gate.resumes_in()
        assert gate.paused and left is not None and 0 < left <= 0.2
        await asyncio.wait_for(gate.admit(), 2)  # the held call goes on once it ends
        assert not gate.paused and gate.auto_resumes == 1
        errors = {"error_class": "pause_timeout"}
        assert _sample(metrics, "openforge_proxy_errors_total", **errors) == 1
        gate.pause(60)
        gate.pause(0.1)  # a new pause replaces the timeout of the one that lasts
        await asyncio.sleep(0.3)
        assert not gate.paused and gate.auto_resumes == 2

    asyncio.run(scenario())


def test_a_drain_waits_for_the_calls_admitted_before_the_pause() -> None:
    async def scenario() -> None:
        gate = Gate(8, PauseMode.WAIT, 1, ProxyMetrics())
        await gate.admit()
        gate.pause(60)
        assert not await gate.drain(0.05)  # a call still holds its slot
        asyncio.get_running_loop().call_later(0.05, gate.release)
        assert await gate.drain(2)
        assert gate.in_flight == 0 and gate.paused
        gate.unpause()
        await gate.admit()
        gate.pause(0.1)
        assert not await gate.drain(5)  # the pause ended first: not drained, and says so
        assert not gate.paused

    asyncio.run(scenario())
