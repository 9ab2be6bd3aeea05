"""An ASGI app served by uvicorn in a daemon thread of this process, on a free loopback port:
the warm start's scripted teacher, and the tests' proxies and upstreams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.local.process import free_port
from proxy.serve import listeners
from proxy.serve import server as make_server
from schemas.errors import ServiceError


@contextmanager
def serve_in_thread(
    app: object,
    what: str,
    log_level: str = "warning",
    unix_socket: Path | None = None,
    host: str = "127.0.0.1",
) -> Iterator[str]:
    """Serve an ASGI app under uvicorn in a daemon thread on a free port of ``host`` (and, if
    given, a Unix socket); yields its URL."""
    port = free_port()
    sockets = listeners(host, port, unix_socket)
    server = make_server(app, log_level=log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ServiceError(f"the {what} did not start within 60 s")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        for s in sockets:
            s.close()
