"""A warm pool: sandboxes started ahead of the rollouts, their harness's runtime already loaded.

    pool = WarmPool(size=4)
    member = pool.claim(shape)          # None: none ready, run a cold sandbox (and one is coming)
    result = member.run(spec, rollout_root, home_to) if member else backend.run(spec)
    pool.close()                        # every member stopped, its directory removed

The pool keeps, per :class:`~infra.sandbox.warm_member.Shape` asked for in the last ``idle_s``
seconds, ``size`` members ready or starting (the run's concurrency): a claim takes one and a new
one starts behind it. A shape nobody asked for in ``idle_s`` has its members stopped, and a
member unclaimed for ``max_age_s`` is retired (its sandbox's own deadline comes after that).
A member that ends before its claim, or is not ready within ``ready_timeout_s``, is
quarantined: stopped, counted, logged with its stderr, and never served. Each member serves
one rollout and is gone (:mod:`infra.sandbox.warm_member`): no state of one rollout can reach
the next.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from infra.sandbox.warm_member import Member, Shape

log = logging.getLogger(__name__)


@dataclass
class PoolStats:
    """What the pool did: members started, claims served warm or missed, quarantined ones."""

    started: int = 0
    served: int = 0
    missed: int = 0
    quarantined: int = 0
    reaped: int = 0


class WarmPool:
    """Warm members per shape; see the module doc. Thread-safe."""

    def __init__(
        self,
        size: int,
        root: Path | None = None,
        idle_s: float = 60.0,
        ready_timeout_s: float = 120.0,
        max_age_s: float = 600.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"a warm pool holds at least 1 member per shape, not {size}")
        self.size = size
        self.idle_s = idle_s
        self.ready_timeout_s = ready_timeout_s
        self.max_age_s = max_age_s
        self.stats = PoolStats()
        self._root_given = root
        self._root: Path | None = None
        self._members: dict[Shape, list[Member]] = defaultdict(list)
        self._asked: dict[Shape, float] = {}
        self._failures: dict[Shape, int] = defaultdict(int)  # quarantined in a row, per shape
        self._not_before: dict[Shape, float] = {}  # no new member of the shape before then
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._keep, name="warm-pool", daemon=True)
        self._thread.start()

    def claim(self, shape: Shape) -> Member | None:
        """A ready member of ``shape``, now removed from the pool (it is the caller's to run);
        None when none is ready. Either way the pool starts members of ``shape`` behind it."""
        with self._lock:
            if self._closed:
                return None
            self._asked[shape] = time.monotonic()
            members = self._members[shape]
            member = next((m for m in members if m.ready()), None)
            if member is not None:
                members.remove(member)
                self.stats.served += 1
                self._failures.pop(shape, None)
            else:
                self.stats.missed += 1
        self._wake.set()
        return member

    def idle(self) -> int:
        """Members held now (ready or starting), all shapes together."""
        with self._lock:
            return sum(len(m) for m in self._members.values())

    def ready(self) -> int:
        """Members ready to serve now, all shapes together."""
        with self._lock:
            return sum(m.ready() for ms in self._members.values() for m in ms)

    def close(self) -> None:
        """Stop every member still held and remove the pool's directory (members out on a
        claim are their callers' to finish)."""
        with self._lock:
            self._closed = True
            members = [m for ms in self._members.values() for m in ms]
            self._members.clear()
        self._wake.set()
        self._thread.join(timeout=30)
        for m in members:
            m.discard(wait=False)
        for m in members:
            m.discard()
        if self._root is not None and self._root_given is None:
            shutil.rmtree(self._root, ignore_errors=True)
        elif self._root is not None:  # a given directory: removed once no member is left in it
            with contextlib.suppress(OSError):
                self._root.rmdir()

    # -- the keeper thread -------------------------------------------------------------------

    def _keep(self) -> None:
        while True:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                stale, to_start = self._survey(time.monotonic())
            for member, why in stale:
                member.discard(wait=False)
                if why:
                    log.warning("warm pool: member %s quarantined: %s", member.dir.name, why)
            for member in to_start:
                try:
                    member.start()
                except OSError as exc:
                    log.warning("warm pool: cannot start a member: %s", exc)
                    with self._lock:
                        self._drop(member)
                        self._quarantined(member.shape, time.monotonic())

    def _survey(self, now: float) -> tuple[list[tuple[Member, str]], list[Member]]:
        """Under the lock: members to stop (with why, '' for an idle shape's) and to start."""
        stale: list[tuple[Member, str]] = []
        for shape, members in list(self._members.items()):
            for m in list(members):
                why = self._unhealthy(m, now)
                if why is not None:
                    members.remove(m)
                    stale.append((m, why))
                    self._quarantined(shape, now)
                elif now - m.started_at > self.max_age_s:  # retired before its deadline
                    members.remove(m)
                    stale.append((m, ""))
                    self.stats.reaped += 1
            if now - self._asked.get(shape, 0.0) > self.idle_s:
                stale += [(m, "") for m in members]
                self.stats.reaped += len(members)
                del self._members[shape]
                for table in (self._asked, self._failures, self._not_before):
                    table.pop(shape, None)
        to_start = []
        for shape in self._asked:
            members = self._members[shape]
            while len(members) < self.size and now >= self._not_before.get(shape, 0.0):
                member = Member(shape, self._directory() / f"m{next(self._ids)}", self.max_age_s)
                members.append(member)
                to_start.append(member)
                self.stats.started += 1
        return stale, to_start

    def _quarantined(self, shape: Shape, now: float) -> None:
        """Count it; the shape's next member waits 0.5 s, doubling per failure in a row up to
        30 s (a shape whose members cannot start costs little)."""
        self.stats.quarantined += 1
        self._failures[shape] += 1
        pause = min(30.0, 0.5 * 2 ** (self._failures[shape] - 1))
        self._not_before[shape] = now + pause

    def _unhealthy(self, member: Member, now: float) -> str | None:
        if member.done.is_set():
            return f"it ended before a claim: {member.failure()}"
        if not member.ready() and now - member.started_at > self.ready_timeout_s:
            return f"not ready after {self.ready_timeout_s:g}s"
        return None

    def _drop(self, member: Member) -> None:
        members = self._members.get(member.shape, [])
        if member in members:
            members.remove(member)

    def _directory(self) -> Path:
        if self._root is None:
            if self._root_given is not None:
                self._root = self._root_given
                self._root.mkdir(parents=True, exist_ok=True)
            else:
                self._root = Path(tempfile.mkdtemp(prefix="openforge-warm-"))
        return self._root
