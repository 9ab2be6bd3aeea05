"""Failpoints: named places where a process can be made to die, for crash tests of real
processes (the way etcd's gofail and TiKV's fail-rs do it).

``OPENFORGE_FAILPOINTS="trainer.after_swap@2,proxy.before_publish"`` makes the process kill
itself with SIGKILL (no clean-up, no flushing: a real crash) the first time it reaches
``hit("trainer.after_swap", 2)``, or any ``hit("proxy.before_publish")``. Unset (always, outside
tests), ``hit`` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "OPENFORGE_FAILPOINTS"


def _armed() -> dict[str, str | None]:
    spec = os.environ.get(ENV, "")
    out: dict[str, str | None] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, at = item.partition("@")
        out[name] = at or None
    return out


_ARMED = _armed()


def hit(name: str, at: int | None = None) -> None:
    """Die here if the failpoint ``name`` is armed (for ``at``, when it names one)."""
    if name not in _ARMED:
        return
    wanted = _ARMED[name]
    if wanted is not None and (at is None or str(at) != wanted):
        return
    print(f"failpoint {name}{'' if at is None else f'@{at}'}: killing pid {os.getpid()}",
          file=sys.stderr, flush=True)  # fmt: skip
    os.kill(os.getpid(), signal.SIGKILL)
