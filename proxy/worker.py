"""One proxy worker process of a pool (:mod:`proxy.pool`): ``python -m proxy.worker``.

The pool writes a pickled :class:`WorkerSpec` to the worker's stdin and passes it the listening
sockets it bound (so ports are taken before any worker starts, with no race). The worker is a
whole proxy (its own rollouts, continuity, publisher, spool and metrics) serving on them.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from proxy.config import ProxyConfig


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs: its index, its config's init fields and its sockets' descriptors."""

    index: int
    config: dict[str, Any]
    fds: tuple[int, ...]

    @classmethod
    def of(cls, index: int, config: ProxyConfig, fds: tuple[int, ...]) -> WorkerSpec:
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
        return cls(index, fields, fds)


def _exit_with_parent(parent: int) -> None:
    """SIGTERM this worker (a graceful stop: the publisher flushes) once the pool's process is
    gone, so a killed pool leaves no worker behind."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main() -> None:
    from proxy.app import create_app
    from proxy.serve import server

    spec: WorkerSpec = pickle.load(sys.stdin.buffer)
    config = ProxyConfig(**spec.config)
    sockets = [socket.socket(fileno=fd) for fd in spec.fds]
    _exit_with_parent(os.getppid())
    sys.setswitchinterval(0.0005)  # as `openforge proxy` does (publisher thread vs event loop)
    try:
        server(create_app(config)).run(sockets=sockets)
    finally:
        for s in sockets:
            s.close()


if __name__ == "__main__":
    main()
