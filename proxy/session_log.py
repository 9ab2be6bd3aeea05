"""Open-mode sessions across a proxy's restarts: which ended, and which were live at a stop.

A session's first rollout is ``session-<identity>``; a later one, once the proxy knows that one
ended, ``session-<identity>.<ms>`` (:mod:`proxy.sessions`). A proxy that forgot the ending in a
restart would start ``session-<identity>`` again: a second rollout under the id of one whose
episode may be built already, whose calls the pipeline would then count late. So each session
end is appended to ``<spool_dir>/sessions-ended`` (identity and rollout id, one JSON line; no
fsync: a line lost in a machine crash costs only that protection) and a starting proxy reads
the last ``capacity`` back into its registry, compacting the file. Feedback by session after a
restart finds the session's last rollout the same way.

A proxy stopped (SIGTERM, Ctrl-C) while sessions are live writes them to
``<spool_dir>/sessions-live`` (identity, rollout id, calls numbered so far), and the next proxy
on that spool directory takes them back as live rollouts: a session that goes on after the
restart records into the same rollout, its calls numbered on from where they were, and one
that does not is ended by the idle sweep as usual (so its episode is built and judged). A proxy
killed outright writes nothing: its live sessions never report their end, and a session that
goes on starts its rollout again under the same id (its episode then waits for the deadline).

With ``--workers N`` each worker keeps its own files (its own spool directory); the front routes a
session to the same worker while N stays the same.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import astuple, dataclass
from pathlib import Path

FILE = "sessions-ended"
LIVE_FILE = "sessions-live"


@dataclass(frozen=True, slots=True)
class LiveSession:
    """A session live when its proxy stopped: its identity, rollout, and calls numbered."""

    identity: str
    rollout_id: str
    calls: int


class SessionLog:
    """Appends session ends to ``<spool_dir>/sessions-ended``; reads them back at start."""

    def __init__(self, spool_dir: Path, capacity: int) -> None:
        self.path, self.capacity = spool_dir / FILE, capacity

    def load(self) -> OrderedDict[str, str]:
        """The last ``capacity`` ended sessions, oldest first (identity -> last rollout id);
        the file is rewritten with just those. Damaged lines are skipped."""
        ended: OrderedDict[str, str] = OrderedDict()
        if self.path.exists():
            for line in self.path.read_text(errors="replace").splitlines():
                try:
                    identity, rollout_id = json.loads(line)
                except (ValueError, TypeError):
                    continue
                ended.pop(str(identity), None)
                ended[str(identity)] = str(rollout_id)
        while len(ended) > self.capacity:
            ended.popitem(last=False)
        self._rewrite(ended)
        return ended

    def append(self, identity: str, rollout_id: str) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps([identity, rollout_id]) + "\n")

    def _rewrite(self, ended: OrderedDict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps([k, v]) + "\n" for k, v in ended.items()))
        os.replace(tmp, self.path)

    def save_live(self, sessions: list[LiveSession]) -> None:
        """Store the sessions live at a stop (none: nothing stored)."""
        path = self.path.with_name(LIVE_FILE)
        if not sessions:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([astuple(s) for s in sessions]))
        os.replace(tmp, path)

    def take_live(self) -> list[LiveSession]:
        """The sessions live when the previous proxy stopped, once (the file is removed); a
        damaged file gives none."""
        path = self.path.with_name(LIVE_FILE)
        try:
            rows = json.loads(path.read_text())
            live = [LiveSession(str(i), str(r), int(c)) for i, r, c in rows]
        except (OSError, ValueError, TypeError):
            live = []
        path.unlink(missing_ok=True)
        return live
