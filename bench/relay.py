"""A bare relay on the proxy's own server stack, as the floor of what any gateway built on it adds.

One route, ``POST /v1/chat/completions``: the body is read, parsed and re-serialised with orjson
and sent to the upstream's same route with aiohttp; the upstream's stream goes back to the
client chunk by chunk through a Starlette ``StreamingResponse``, served by
:func:`proxy.serve.serve` (uvicorn with uvloop and httptools, the listeners and settings
``openforge proxy`` runs with). Nothing is rendered, tokenized, recorded or
checked, so the latency it adds is the server's, the client's and the extra hop's alone.

    python -m bench.relay --port 8300 --upstream http://127.0.0.1:8200

:func:`app_from_env` is the same app for servers that import it by name (``bench.server_stack``
serves it with granian): the upstream comes from ``OPENFORGE_RELAY_UPSTREAM``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.serve import serve


def create_app(upstream: str) -> Starlette:
    session: aiohttp.ClientSession | None = None

    async def chat(request: Request) -> Response:
        assert session is not None
        body = orjson.loads(await request.body())
        resp = await session.post(
            f"{upstream}/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(stream(), status_code=resp.status, media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        try:
            yield
        finally:
            await session.close()

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def app_from_env() -> Starlette:
    """The relay for the upstream in ``OPENFORGE_RELAY_UPSTREAM`` (a factory: no import-time
    state)."""
    return create_app(os.environ["OPENFORGE_RELAY_UPSTREAM"].rstrip("/"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    args = parser.parse_args()
    serve(create_app(args.upstream.rstrip("/")), "127.0.0.1", args.port)  # the proxy's server


if __name__ == "__main__":
    main()
