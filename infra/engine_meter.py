"""How busy the serving engine is: vLLM's own Prometheus metrics, sampled in the background.

Every ``interval`` seconds :class:`EngineMeter` reads ``GET /metrics`` of a vLLM server and
notes whether any request was running (``vllm:num_requests_running``, summed over its label
sets). :meth:`EngineMeter.take` answers the fraction of the samples since the last take that
found it busy; the trainer records it per update (``engine/busy_fraction``), so the audit can
say whether the engine or the trainer bounded a run. A sample that fails (the server
restarting) is skipped, not counted either way. :meth:`EngineMeter.since_start` gives vLLM's
own totals since the meter started: per call, prefill and decode time, tokens, and how much of
the prompts the prefix cache served (:class:`EngineTotals`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import httpx

METRIC = "vllm:num_requests_running"

# vLLM's counters of where a call's time goes, summed by EngineTotals (names as vLLM 0.32's
# Prometheus logger writes them).
_TOTALS = {
    "requests": "vllm:request_prefill_time_seconds_count",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
}


def metric(text: str, name: str) -> float | None:
    """``name`` summed over its label sets in Prometheus ``text``; None if it is not there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return total if seen else None


def running(text: str) -> float | None:
    """The requests running, summed over the metric's label sets; None if it is not there."""
    return metric(text, METRIC)


@dataclass(frozen=True)
class EngineTotals:
    """vLLM's running totals: requests, seconds of prefill and decode, tokens in and out, and
    prompt tokens asked of and found in the prefix cache."""

    requests: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0

    @classmethod
    def parse(cls, text: str) -> EngineTotals:
        return cls(**{k: metric(text, name) or 0.0 for k, name in _TOTALS.items()})

    def since(self, earlier: EngineTotals) -> EngineTotals:
        return EngineTotals(**{k: getattr(self, k) - getattr(earlier, k) for k in _TOTALS})

    def per_call(self) -> dict[str, float]:
        """Per engine request (a harness's call): prefill and decode milliseconds, prompt and
        generated tokens; and the share of prompt tokens the prefix cache served."""
        n = self.requests or 1.0
        return {
            "calls": self.requests,
            "prefill_ms_per_call": 1000 * self.prefill_s / n,
            "decode_ms_per_call": 1000 * self.decode_s / n,
            "prompt_tokens_per_call": self.prompt_tokens / n,
            "generated_tokens_per_call": self.generation_tokens / n,
            "prefix_cache_hit_rate": self.prefix_cache_hits / (self.prefix_cache_queries or 1.0),
        }


class EngineMeter:
    """Samples ``base_url``'s metrics from a thread until :meth:`close` (a context manager)."""

    def __init__(self, base_url: str, interval: float = 0.2) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval = interval
        self._busy = self._samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=max(interval * 5, 1.0))
        self._start = self.totals()
        self._thread = threading.Thread(target=self._run, name="engine-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                value = running(self._client.get(self.url).text)
            except httpx.HTTPError:
                continue
            if value is not None:
                with self._lock:
                    self._samples += 1
                    self._busy += value > 0

    def take(self) -> float | None:
        """The busy fraction since the last take (None: no sample succeeded meanwhile)."""
        with self._lock:
            busy, samples = self._busy, self._samples
            self._busy = self._samples = 0
        return busy / samples if samples else None

    def totals(self) -> EngineTotals:
        """The engine's totals now (all zero if its metrics cannot be read)."""
        try:
            return EngineTotals.parse(self._client.get(self.url).text)
        except httpx.HTTPError:
            return EngineTotals()

    def since_start(self) -> EngineTotals:
        """The engine's totals since this meter started."""
        return self.totals().since(self._start)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def __enter__(self) -> EngineMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
