"""The gate every call passes: the pause during a weight swap, and the concurrency slots.

:meth:`Gate.admit` waits out a pause (in reject mode it refuses with 429 while one lasts), then
takes one of ``max_concurrency`` slots or refuses with 429; the caller gives the slot back with
:meth:`Gate.release` exactly once (:class:`proxy.lifecycle.CallLifecycle` does). A pause ends
by :meth:`Gate.unpause` or by its own timeout (then with a warning and
``openforge_proxy_errors{error_class="pause_timeout"}``). :meth:`Gate.drain` waits, while
paused, until no call holds a slot.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.config import PauseMode
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics

log = logging.getLogger("openforge.proxy")


class Gate:
    """The pause and the slots of one proxy; ``openforge_proxy_in_flight`` reads its count.
    Use it from the event loop that runs the calls."""

    def __init__(
        self,
        max_concurrency: int,
        pause_mode: PauseMode,
        pause_retry_after: int,
        metrics: ProxyMetrics,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.pause_mode = pause_mode
        self.pause_retry_after = pause_retry_after
        self.in_flight = 0  # calls holding a slot
        self.auto_resumes = 0  # pauses that ended by their timeout
        self._metrics = metrics
        self._resume = asyncio.Event()  # set exactly while not paused
        self._resume.set()
        self._idle = asyncio.Event()  # set exactly while no call holds a slot
        self._idle.set()
        self._pause_timer: asyncio.TimerHandle | None = None
        metrics.in_flight.set_function(lambda: self.in_flight)

    # --- admission ----------------------------------------------------------------------------

    async def admit(self) -> None:
        """Wait for (or, in reject mode, refuse with 429 during) a pause, then take a slot or
        refuse with 429 when all ``max_concurrency`` are taken."""
        if not self._resume.is_set():
            if self.pause_mode is PauseMode.REJECT:
                raise ProxyError(
                    429,
                    "the policy is being updated; retry shortly",
                    retry_after=str(self.pause_retry_after),
                    code="paused",
                )
            await self._resume.wait()
        if self.in_flight >= self.max_concurrency:
            self._metrics.errors.labels("concurrency").inc()
            raise ProxyError(
                429,
                f"too many calls in flight ({self.in_flight}); retry shortly",
                retry_after="1",
                code="concurrency_limit",
            )
        self.in_flight += 1
        self._idle.clear()

    def release(self) -> None:
        """Give back the slot :meth:`admit` took."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    # --- the pause ----------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    def pause(self, timeout: float) -> None:
        """Hold new calls until :meth:`unpause`, or ``timeout`` seconds (then they resume by
        themselves); a new pause replaces the timeout of the one that lasts."""
        if self._pause_timer is not None:
            self._pause_timer.cancel()
        self._resume.clear()
        self._pause_timer = asyncio.get_running_loop().call_later(timeout, self._pause_expired)

    def _pause_expired(self) -> None:
        log.warning("the pause was not ended by /admin/resume in time: resuming calls")
        self.auto_resumes += 1
        self._metrics.errors.labels("pause_timeout").inc()
        self.unpause()

    def unpause(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None
        self._resume.set()

    def resumes_in(self) -> float | None:
        """Seconds until the current pause ends by itself (None: not paused)."""
        if self._pause_timer is None or not self.paused:
            return None
        left = self._pause_timer.when() - asyncio.get_running_loop().time()
        return round(max(0.0, left), 3)  # milliseconds: the loop's clock sum is not exact

    async def drain(self, timeout: float) -> bool:
        """While paused, wait until no call holds a slot: True once none does, False after
        ``timeout`` seconds, or when the pause ends first (by its own timeout). Calls held at
        the gate hold no slot, and none is admitted while the pause lasts, so True means every
        call admitted before the pause has ended (and been recorded). Not paused: whether no
        call holds a slot now."""
        left = self.resumes_in()
        if left is None:
            return self.in_flight == 0
        try:
            await asyncio.wait_for(self._idle.wait(), min(timeout, left))
        except TimeoutError:
            return False
        return self.paused
