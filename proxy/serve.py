"""Serving the proxy app: a TCP port and, optionally, a Unix socket, from one uvicorn server.

Sandboxed rollouts have no network; they reach the proxy through its Unix socket, bind-mounted
into the sandbox (see :mod:`infra.sandbox`). Both listeners serve the same app and state.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from pathlib import Path

import uvicorn


def listeners(host: str, port: int, unix_socket: Path | None = None) -> list[socket.socket]:
    """Bound, listening sockets: ``host:port`` and, if given, ``unix_socket`` (mode 0666 so a
    sandbox's own user can connect; replaced if a stale one is there)."""
    tcp = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((host, port))
    tcp.listen(2048)
    out = [tcp]
    if unix_socket is not None:
        unix_socket.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            unix_socket.unlink()
        uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uds.bind(str(unix_socket))
        os.chmod(unix_socket, 0o666)
        uds.listen(2048)
        out.append(uds)
    return out


# How long an idle kept-alive connection stays open. Longer than any client keeps an idle one
# (httpx: 5 s): at uvicorn's own 5 s a client could send on a connection in the very moment the
# server closed it, and its call failed with "Server disconnected without sending a response"
# (an orchestrator's registration did so in CI).
KEEP_ALIVE_S = 65


def server(app: object, **options: object) -> uvicorn.Server:
    """A uvicorn server for ``app`` with our defaults (no access log, warnings only, idle
    connections kept :data:`KEEP_ALIVE_S`)."""
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        log_level=str(options.pop("log_level", "warning")),
        access_log=False,
        **options,  # type: ignore[arg-type]
    )
    return uvicorn.Server(config)


def serve(
    app: object, host: str, port: int, unix_socket: Path | None = None, *, announce: str = ""
) -> None:
    """Serve ``app`` until interrupted, on the TCP port and the Unix socket; with ``announce``
    (a name), say on stderr where it listens once the sockets are bound (connections made from
    then on wait for the app to start)."""
    sockets = listeners(host, port, unix_socket)
    if announce:
        where = f"http://{host}:{port}" + (f" and unix:{unix_socket}" if unix_socket else "")
        print(f"{announce} listening on {where}; Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        server(app).run(sockets=sockets)
    finally:
        for s in sockets:
            s.close()
        if unix_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                unix_socket.unlink()
