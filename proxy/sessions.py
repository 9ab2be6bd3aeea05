"""Open-mode sessions: the rollout a harness's session records into, and when it ends.

In open mode nobody registers rollouts: a call's session identity header names its rollout
(:func:`proxy.attribution.session_identity`), and the proxy runs in front of traffic for weeks.
A session's rollout ends

- after ``session_idle_timeout`` seconds with no call (none waiting or in flight): the
  :class:`SessionReaper` records it ``finished`` with the reason, so the pipeline can assemble
  its episode and the proxy forgets it;
- on an explicit end (``POST /admin/rollouts/R/finish``), as any rollout;
- with ``session_client_header`` set, when its client starts a new session and it has no call
  waiting or in flight (:mod:`proxy.session_clients`): the harness moved on, so the episode
  need not wait out the idle time.

A later call of the same session is never refused for that: it starts the session's next
rollout. The first is ``session-<identity>``; while a rollout of the session is remembered as
ended (across restarts too: :mod:`proxy.session_log`), the next is ``session-<identity>.<ms>``
(the start in Unix milliseconds). Every rollout of a session
carries ``metadata.session`` = the identity, for queries. The proxy keeps nothing per session
beyond its live rollout, and finished rollouts stay in the registry's bounded memory
(``finished_rollouts``), so memory is bounded by the live sessions plus that bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from proxy.rollouts import Rollout
from proxy.state import ProxyState
from schemas.enums import RolloutPhase

log = logging.getLogger(__name__)

MAX_SWEEP_INTERVAL = 60.0  # seconds between sweeps, at most


NEW_SESSION = "a new session of its client"


def session_rollout(state: ProxyState, identity: str, client: str | None = None) -> Rollout:
    """The live rollout of session ``identity``; its next one (registered, its start recorded)
    when it has none. ``client``: the caller's client (hashed), whose previous session ends
    here if it is idle (see the module docstring)."""
    if client is not None:
        _end_previous(state, state.clients.switch(client, identity))
    first = f"session-{identity}"
    live = state.rollouts.by_session(identity) or state.rollouts.get(first)  # or registered
    if live is not None:
        return live
    rollout_id = first
    if state.rollouts.ended_before(identity) or state.rollouts.finished(first) is not None:
        rollout_id = f"{first}.{time.time_ns() // 1_000_000}"
    rollout = state.rollouts.create(
        rollout_id, mint_key=False, session=identity, metadata={"session": identity}
    )
    state.recorder.started(rollout)
    return rollout


def _end_previous(state: ProxyState, previous: str | None) -> None:
    """End session ``previous``'s live rollout unless a call of it is waiting or in flight
    (that one the idle sweep ends). The end is recorded before the new session's start."""
    rollout = state.rollouts.by_session(previous) if previous is not None else None
    if rollout is not None and rollout.idle_for(time.monotonic()) > 0:
        state.end_soon(rollout, RolloutPhase.FINISHED, backend="proxy", message=NEW_SESSION)


class SessionReaper:
    """Ends open-mode session rollouts idle for ``timeout`` seconds (see the module docstring).

    :meth:`sweep` ends what is idle now; :meth:`run` sweeps every ``timeout / 4`` seconds (at
    most :data:`MAX_SWEEP_INTERVAL`) until cancelled."""

    def __init__(self, state: ProxyState, timeout: float) -> None:
        self.state, self.timeout = state, timeout
        self.ended = 0  # rollouts ended for idleness

    async def sweep(self) -> int:
        """End every session rollout idle for ``timeout`` seconds; how many were ended."""
        now = time.monotonic()
        idle = [
            r
            for r in self.state.rollouts.live()
            if r.session is not None and r.idle_for(now) >= self.timeout
        ]
        for rollout in idle:
            message = f"session idle for {self.timeout:g} s"
            await self.state.end(rollout, RolloutPhase.FINISHED, backend="proxy", message=message)
            self.ended += 1
        live = {r.session for r in self.state.rollouts.live() if r.session is not None}
        self.state.clients.prune(live)
        return len(idle)

    async def run(self) -> None:
        interval = min(MAX_SWEEP_INTERVAL, self.timeout / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep()
            except Exception:  # a sweep that fails (the log down: the record waits) retries
                log.exception("ending idle sessions failed; retrying in %.0f s", interval)


@contextlib.asynccontextmanager
async def reaping(state: ProxyState, timeout: float) -> AsyncIterator[SessionReaper | None]:
    """Run a :class:`SessionReaper` for the block (none when ``timeout`` is 0)."""
    if timeout <= 0:
        yield None
        return
    reaper = SessionReaper(state, timeout)
    task = asyncio.create_task(reaper.run(), name="openforge-session-reaper")
    try:
        yield reaper
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
