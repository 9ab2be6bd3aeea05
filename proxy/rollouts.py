"""Rollouts the proxy knows: live ones, and a bounded memory of recently finished ones.

A rollout is attributed by its path id, its minted API key, or (open mode) a session identity; a
key minted for one rollout only ever records into that rollout. Each live rollout owns its call
counter, its continuity tracker and its delta encoder, so nothing about it lives proxy-wide.

Finishing a rollout drops it (and its key) from the live maps; what a late caller needs (its key,
task id, phase) stays in a least-recently-finished memory of ``finished_capacity`` entries, so a
proxy that runs for weeks holds memory for its live rollouts plus that bound.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical import CallRequest, Generation
from proxy.continuity import ContinuityTracker, Plan
from proxy.render import Renderer
from schemas.delta import DeltaEncoder, HistoryDelta, PromptDelta, Scrub
from schemas.enums import CompletionStatus, Dialect, RolloutPhase

KEY_PREFIX = "ofk_"


@dataclass
class Rollout:
    """A live rollout. Its calls are numbered and planned one at a time (:meth:`begin_call`)."""

    rollout_id: str
    created_us: int
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    harness_version: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    record: bool = True  # False: calls are served, nothing of the rollout is published
    session: str | None = None  # open mode: the session identity it records (proxy.sessions)
    # (prompt tokens, context) of its longest prompt refused for leaving no room to answer
    too_long: tuple[int, int] | None = field(default=None, init=False)
    first_call_us: int | None = field(default=None, init=False)  # when its first call arrived
    _in_flight: int = field(default=0, init=False, repr=False)
    _last_active: float = field(default_factory=time.monotonic, init=False, repr=False)
    _next_call: int = field(default=0, init=False, repr=False)
    _tracker: ContinuityTracker = field(init=False, repr=False)
    _encoder: DeltaEncoder = field(default_factory=DeltaEncoder, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._tracker = ContinuityTracker(self.rollout_id)

    async def begin_call(self, req: CallRequest, renderer: Renderer) -> tuple[int, Plan]:
        """The next call index and the call's continuity plan (its thread and prompt ids).

        Calls of one rollout take their index and plan in arrival order, one at a time.
        """
        async with self._lock:
            index = self._next_call
            self._next_call += 1
            if self.first_call_us is None:
                self.first_call_us = time.time_ns() // 1000
            return index, self._tracker.plan(req, renderer)

    @property
    def first_call_s(self) -> float | None:
        """Seconds from its registration to its first call's arrival (None: no call yet): the
        workspace, the sandbox's start and the harness's own start-up."""
        if self.first_call_us is None:
            return None
        return max(0.0, (self.first_call_us - self.created_us) / 1e6)

    @property
    def calls(self) -> int:
        """How many calls were numbered for this rollout (each gets one completion event)."""
        return self._next_call

    def refused_too_long(self, prompt_tokens: int, context: int) -> None:
        """A call's prompt of ``prompt_tokens`` left no room in the ``context``: kept (the
        longest) for the rollout's finish, so the orchestrator can stop the run once."""
        if self.too_long is None or prompt_tokens > self.too_long[0]:
            self.too_long = (prompt_tokens, context)

    def number_from(self, calls: int) -> None:
        """Number its next call ``calls`` (a rollout taken over from a stopped proxy)."""
        self._next_call = calls

    def enter(self) -> None:
        """A call of this rollout starts (it is active until the matching :meth:`leave`)."""
        self._in_flight += 1
        self._last_active = time.monotonic()

    def leave(self) -> None:
        """A call of this rollout ended."""
        self._in_flight -= 1
        self._last_active = time.monotonic()

    def idle_for(self, now: float) -> float:
        """Seconds since its last call ended (0 while a call is in flight)."""
        return 0.0 if self._in_flight else max(0.0, now - self._last_active)

    def delta(
        self,
        plan: Plan,
        event_id: str,
        dialect: Dialect,
        completion: Sequence[int],
        body: dict[str, Any] | None,
        scrub: Scrub | None = None,
    ) -> tuple[PromptDelta, HistoryDelta | None]:
        """The call's prompt (and request body, if recorded, as ``scrub`` leaves it) in delta
        form against its thread's previous call; remembers this call as that thread's latest
        for the next one."""
        return self._encoder.encode(
            plan.thread.thread_id, event_id, dialect, plan.prompt_ids, completion, body, scrub
        )

    def commit(
        self, plan: Plan, event_id: str, req: CallRequest, gen: Generation, status: CompletionStatus
    ) -> None:
        """Remember the ended call as its thread's latest, for the continuity of the next."""
        self._tracker.commit(plan, event_id, req, gen, status)


@dataclass(frozen=True, slots=True)
class FinishedRollout:
    """What is kept of a finished rollout: enough to attribute a late reward."""

    rollout_id: str
    phase: RolloutPhase
    task_id: str | None
    api_key: str | None
    record: bool = True
    calls: int = 0  # calls it had made when it finished (what its finish answered)
    first_call_s: float | None = None  # registration to first call (what its finish answered)


class RolloutRegistry:
    """Live rollouts by id and by key, and the last ``finished_capacity`` finished ones."""

    def __init__(self, finished_capacity: int = 10_000) -> None:
        self.finished_capacity = finished_capacity
        self._by_id: dict[str, Rollout] = {}
        self._by_key: dict[str, Rollout] = {}
        self._by_session: dict[str, Rollout] = {}  # open mode: identity -> its live rollout
        self._session_last: OrderedDict[str, str] = OrderedDict()  # identity -> its last ended
        self._finished: OrderedDict[str, FinishedRollout] = OrderedDict()
        self._finished_keys: dict[str, str] = {}  # key -> finished rollout id

    def __len__(self) -> int:
        """The number of live rollouts."""
        return len(self._by_id)

    @property
    def finished_count(self) -> int:
        """The number of finished rollouts remembered (at most ``finished_capacity``)."""
        return len(self._finished)

    def live(self) -> list[Rollout]:
        """The live rollouts, oldest first."""
        return list(self._by_id.values())

    def get(self, rollout_id: str) -> Rollout | None:
        """The live rollout ``rollout_id`` (None once it has finished)."""
        return self._by_id.get(rollout_id)

    def by_key(self, key: str) -> Rollout | None:
        """The live rollout this key was minted for."""
        return self._by_key.get(key)

    def by_session(self, identity: str) -> Rollout | None:
        """The live rollout of the open-mode session ``identity``."""
        return self._by_session.get(identity)

    def remember_sessions(self, ended: OrderedDict[str, str]) -> None:
        """Sessions that ended before this proxy started (identity -> last rollout id, oldest
        first; :mod:`proxy.session_log`)."""
        for identity, rollout_id in ended.items():
            self._session_last[identity] = rollout_id

    def ended_before(self, identity: str) -> bool:
        """Whether a rollout of session ``identity`` ended (while that is remembered)."""
        return identity in self._session_last

    def latest_of_session(self, identity: str) -> str | None:
        """The id of session ``identity``'s live rollout, else of its last ended one while that
        is remembered (None: neither)."""
        live = self._by_session.get(identity)
        return live.rollout_id if live is not None else self._session_last.get(identity)

    def finished(self, rollout_id: str) -> FinishedRollout | None:
        """The finished rollout ``rollout_id``, while it is remembered."""
        return self._finished.get(rollout_id)

    def finished_by_key(self, key: str) -> FinishedRollout | None:
        """The remembered finished rollout this key was minted for."""
        rollout_id = self._finished_keys.get(key)
        return self._finished.get(rollout_id) if rollout_id is not None else None

    def create(self, rollout_id: str, *, mint_key: bool, **fields: Any) -> Rollout:
        """Register a live rollout (the caller checks the id is new), minting a key if asked."""
        rollout = Rollout(rollout_id=rollout_id, created_us=time.time_ns() // 1000, **fields)
        if mint_key:
            rollout.api_key = KEY_PREFIX + secrets.token_urlsafe(24)
            self._by_key[rollout.api_key] = rollout
        self._by_id[rollout_id] = rollout
        if rollout.session is not None:
            self._by_session[rollout.session] = rollout
        return rollout

    def finish(self, rollout: Rollout, phase: RolloutPhase) -> FinishedRollout:
        """Drop a live rollout and its key; remember it as finished, forgetting the oldest
        finished rollout beyond ``finished_capacity``. Calls still in flight keep their
        reference and record normally."""
        self._by_id.pop(rollout.rollout_id, None)
        if rollout.api_key is not None:
            self._by_key.pop(rollout.api_key, None)
        if rollout.session is not None:
            if self._by_session.get(rollout.session) is rollout:
                del self._by_session[rollout.session]
            self._session_last[rollout.session] = rollout.rollout_id
            self._session_last.move_to_end(rollout.session)
            while len(self._session_last) > self.finished_capacity:
                self._session_last.popitem(last=False)
        done = FinishedRollout(
            rollout.rollout_id,
            phase,
            rollout.task_id,
            rollout.api_key,
            rollout.record,
            rollout.calls,
            rollout.first_call_s,
        )
        self._finished[rollout.rollout_id] = done
        if done.api_key is not None:
            self._finished_keys[done.api_key] = done.rollout_id
        while len(self._finished) > self.finished_capacity:
            _, old = self._finished.popitem(last=False)
            if old.api_key is not None:
                self._finished_keys.pop(old.api_key, None)
        return done
