"""Prometheus metrics of one proxy instance (its own registry, served at ``/metrics``).

The metric names are an interface (dashboards read them) and stay as they are; a "request" in
them is a call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ProxyMetrics:
    """The counters, histograms and gauges; :class:`proxy.lifecycle.CallLifecycle` updates the
    per-call ones once per call."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "openforge_proxy_requests",
            "Calls by dialect and the HTTP status answered.",
            ["dialect", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "openforge_proxy_request_seconds",
            "Time from a call's arrival to its last byte, by dialect.",
            ["dialect", "streamed"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.first_token = Histogram(
            "openforge_proxy_first_token_seconds",
            "Time from a call's arrival to its first generated token.",
            ["dialect"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.tokens = Counter(
            "openforge_proxy_tokens",
            "Tokens by kind (prompt, completion, reused).",
            ["kind"],
            registry=self.registry,
        )
        self.continuity = Counter(
            "openforge_proxy_continuity",
            "Calls by token-continuity class.",
            ["continuity"],
            registry=self.registry,
        )
        self.events_published = Counter(
            "openforge_proxy_events_published",
            "Events confirmed by the event log.",
            registry=self.registry,
        )
        self.events_spooled = Counter(
            "openforge_proxy_events_spooled",
            "Events written to the local spool instead.",
            registry=self.registry,
        )
        self.events_dead_lettered = Counter(
            "openforge_proxy_events_dead_lettered",
            "Events the event log cannot take, written to the dead-letter file instead.",
            registry=self.registry,
        )
        self.errors = Counter(
            "openforge_proxy_errors",
            "Errors by class.",
            ["error_class"],
            registry=self.registry,
        )
        self.redactions = Counter(
            "openforge_proxy_redactions",
            "Secrets replaced in recorded text, by pattern name (token ids are never changed).",
            ["pattern"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "openforge_proxy_in_flight",
            "Calls in flight.",
            registry=self.registry,
        )
        self.policy_version = Gauge(
            "openforge_proxy_policy_version",
            "Current policy version.",
            registry=self.registry,
        )

    def count_redactions(self, counts: dict[str, int]) -> None:
        """Add a redactor's running counts (the caller clears them)."""
        for name, n in counts.items():
            self.redactions.labels(name).inc(n)

    def on_publish(self, published: int, spooled: int) -> None:
        if published:
            self.events_published.inc(published)
        if spooled:
            self.events_spooled.inc(spooled)
