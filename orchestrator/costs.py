"""What one attempt of a rollout cost, gathered while it runs (``RolloutEvent.costs``; the names
and their meanings are :data:`schemas.rollout.COSTS`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from infra.sandbox import SandboxResult
from schemas.rollout import COSTS


class CostMeter:
    """Seconds per phase, and each sandbox's CPU time and peak memory, by cost name."""

    def __init__(self) -> None:
        self.costs: dict[str, float] = {}

    def add(self, name: str, value: float | None) -> None:
        """``value`` added to ``name`` (None: not measured, left out)."""
        assert name in COSTS, f"{name} is not a documented cost (schemas.rollout.COSTS)"
        if value is not None:
            self.costs[name] = self.costs.get(name, 0.0) + value

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        """The seconds the block took, added to ``name``."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - start)

    def sandbox(self, role: str, result: SandboxResult) -> None:
        """A sandbox run of ``role`` (agent, verifier): its start and CPU time added, its peak
        memory the highest of the role's runs."""
        self.add(f"{role}_cpu_s", result.cpu_s)
        self.add(f"{role}_start_s", result.start_s)
        peak = result.peak_memory_mib
        if peak is not None:
            name = f"{role}_peak_mib"
            assert name in COSTS, name
            self.costs[name] = max(self.costs.get(name, 0.0), peak)
