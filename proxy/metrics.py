"""Prometheus metrics of one proxy instance (its own registry, served at ``/metrics``).

The metric names are an interface (dashboards read them) and stay as they are; a "request" in
them is a call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)  # histogram buckets


class ProxyMetrics:
    """The counters, histograms and gauges. :class:`proxy.lifecycle.CallLifecycle` updates the
    per-call ones once per call; the gauges read the gate's and the state's own values."""

    calls: Counter
    latency: Histogram
    first_token: Histogram
    tokens: Counter
    continuity: Counter
    events_published: Counter
    events_spooled: Counter
    events_dead_lettered: Counter
    errors: Counter
    redactions: Counter
    in_flight: Gauge
    policy_version: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._call_metrics()
        self._event_metrics()
        self._errors_and_redactions()
        self._gauges()

    def _call_metrics(self) -> None:
        """What the calls did: answers, times, tokens, continuity, errors."""
        registry = self.registry
        self.calls = Counter(
            "openforge_proxy_requests",
            "Calls by dialect and the HTTP status answered.",
            ["dialect", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "openforge_proxy_request_seconds",
            "Time from a call's arrival to its last byte, by dialect.",
            ["dialect", "streamed"],
            registry=registry,
            buckets=(*SECONDS, 60, 120),
        )
        self.first_token = Histogram(
            "openforge_proxy_first_token_seconds",
            "Time from a call's arrival to its first generated token.",
            ["dialect"],
            registry=registry,
            buckets=SECONDS,
        )
        self.tokens = Counter(
            "openforge_proxy_tokens",
            "Tokens by kind (prompt, completion, reused).",
            ["kind"],
            registry=registry,
        )
        self.continuity = Counter(
            "openforge_proxy_continuity",
            "Calls by token-continuity class.",
            ["continuity"],
            registry=registry,
        )
        self.images = Counter(
            "openforge_proxy_images",
            "Images in recorded calls' prompts (in_prompt: each time a prompt holds one; "
            "stored: new in the image store).",
            ["kind"],
            registry=registry,
        )
        self.image_bytes = Counter(
            "openforge_proxy_image_store_bytes",
            "Bytes of the images written to the image store.",
            registry=registry,
        )

    def _event_metrics(self) -> None:
        """Where the records went."""
        registry = self.registry
        self.events_published = Counter(
            "openforge_proxy_events_published",
            "Events confirmed by the event log.",
            registry=registry,
        )
        self.events_spooled = Counter(
            "openforge_proxy_events_spooled",
            "Events written to the local spool instead.",
            registry=registry,
        )
        self.events_dead_lettered = Counter(
            "openforge_proxy_events_dead_lettered",
            "Events the event log cannot take, written to the dead-letter file instead.",
            registry=registry,
        )

    def _errors_and_redactions(self) -> None:
        """What went wrong, by class, and the secrets redaction removed, by pattern."""
        registry = self.registry
        self.errors = Counter(
            "openforge_proxy_errors", "Errors by class.", ["error_class"], registry=registry
        )
        self.redactions = Counter(
            "openforge_proxy_redactions",
            "Secrets replaced in recorded text, by pattern name (token ids are never changed).",
            ["pattern"],
            registry=registry,
        )

    def _gauges(self) -> None:
        """Values read when scraped (each owner sets the function that reads it)."""
        self.in_flight = Gauge(
            "openforge_proxy_in_flight", "Calls in flight.", registry=self.registry
        )
        self.policy_version = Gauge(
            "openforge_proxy_policy_version", "Current policy version.", registry=self.registry
        )

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format."""
        return generate_latest(self.registry)

    def count_rejected(self, dialect: str, status: int) -> None:
        """A call refused before it got a slot (attribution, body, parse, recording, pause,
        limit), answered with ``status``."""
        self.calls.labels(dialect, str(status)).inc()
        self.errors.labels("rejected").inc()

    def count_redactions(self, counts: dict[str, int]) -> None:
        """Add a redactor's running counts (the caller clears them)."""
        for name, n in counts.items():
            self.redactions.labels(name).inc(n)

    def on_publish(self, published: int, spooled: int) -> None:
        if published:
            self.events_published.inc(published)
        if spooled:
            self.events_spooled.inc(spooled)
