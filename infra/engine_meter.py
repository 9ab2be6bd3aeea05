"""How busy the serving engine is: vLLM's own Prometheus metrics, sampled in the background.

Every ``interval`` seconds :class:`EngineMeter` reads ``GET /metrics`` of a vLLM server and
notes whether any request was running (``vllm:num_requests_running``, summed over its label
sets). :meth:`EngineMeter.take` answers the fraction of the samples since the last take that
found it busy; the trainer records it per update (``engine/busy_fraction``), so the audit can
say whether the engine or the trainer bounded a run. A sample that fails (the server
restarting) is skipped, not counted either way.
"""

from __future__ import annotations

import threading

import httpx

METRIC = "vllm:num_requests_running"


def running(text: str) -> float | None:
    """The requests running, summed over the metric's label sets; None if it is not there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(METRIC) and line[len(METRIC) : len(METRIC) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return total if seen else None


class EngineMeter:
    """Samples ``base_url``'s metrics from a thread until :meth:`close` (a context manager)."""

    def __init__(self, base_url: str, interval: float = 0.2) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval = interval
        self._busy = self._samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=max(interval * 5, 1.0))
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

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def __enter__(self) -> EngineMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
