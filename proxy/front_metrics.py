"""The front's ``/metrics``: its own counters and every worker's metrics, in one scrape.

A scrape of the front (``GET /metrics``) fetches each worker's ``/metrics`` at once and serves
all of their samples with a ``worker`` label added (``worker="0"``, ...), family by family, after
the front's own:

    openforge_proxy_front_forwarded_total{worker}      calls and other requests the front
                                                       relayed to a worker (the extra hop; 0
                                                       when every harness calls its base_url)
    openforge_proxy_front_registrations_total{worker}  rollouts assigned to each worker
    openforge_proxy_worker_up{worker}                  1 when the worker's scrape answered
    openforge_proxy_worker_restarts{worker}            times the pool restarted it

Samples are labelled, not summed: a worker's gauges (``in_flight``, the policy version) do not
add up, and a sum is one PromQL ``sum without (worker) (...)`` away. A worker that does not
answer is left out of that scrape (``up`` 0). Each worker still serves its own ``/metrics`` at
its ``base_url`` for a scraper that prefers one target per worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from proxy.pool import Worker


class FrontMetrics:
    """The front's own counters; :meth:`scrape` adds the workers' metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.forwarded = Counter(
            "openforge_proxy_front_forwarded",
            "Requests the front relayed to a worker (an extra hop), by worker.",
            ["worker"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "openforge_proxy_front_registrations",
            "Rollouts the front assigned, by worker.",
            ["worker"],
            registry=self.registry,
        )
        self.up = Gauge(
            "openforge_proxy_worker_up",
            "1 when the worker answered the front's scrape.",
            ["worker"],
            registry=self.registry,
        )
        self.restarts = Gauge(
            "openforge_proxy_worker_restarts",
            "Times the pool restarted the worker.",
            ["worker"],
            registry=self.registry,
        )

    async def scrape(self, client: httpx.AsyncClient, workers: Sequence[Worker]) -> bytes:
        """The exposition text: the front's metrics, then every worker's with its label."""
        texts = await asyncio.gather(*(_fetch(client, w) for w in workers))
        for worker, text in zip(workers, texts, strict=True):
            self.up.labels(str(worker.index)).set(0 if text is None else 1)
            self.restarts.labels(str(worker.index)).set(worker.restarts)
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Families(self.registry, list(_labelled(workers, texts))))
        return generate_latest(merged)


async def _fetch(client: httpx.AsyncClient, worker: Worker) -> str | None:
    if worker.exited() is not None:
        return None
    try:
        resp = await client.get(f"{worker.base_url}/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


def _labelled(workers: Sequence[Worker], texts: Sequence[str | None]) -> Iterator[Metric]:
    """One family per metric name, holding every worker's samples with ``worker`` added."""
    families: dict[str, Metric] = {}
    for worker, text in zip(workers, texts, strict=True):
        if text is None:
            continue
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for s in family.samples:
                merged.add_sample(s.name, {**s.labels, "worker": str(worker.index)}, s.value)
    yield from families.values()


class _Families(Collector):
    def __init__(self, own: CollectorRegistry, families: Iterable[Metric]) -> None:
        self.own, self.families = own, list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.own.collect()
        yield from self.families
