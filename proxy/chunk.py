"""What an upstream streams back (:class:`Chunk`), its HTTP errors as ProxyErrors, and the
pooled HTTP client both paths to the engine share (:class:`PooledClient`)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.errors import ProxyError
from schemas.completion import SamplingParams

KEEPALIVE_S = 4.0  # idle pooled connections are closed after this
STALE_RETRIES = 3  # sends retried on a new connection when a pooled one was closed meanwhile


@dataclass(slots=True)
class Chunk:
    """A piece of a generation as the upstream sent it (what one network read brought)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    policy_version: int | None = None  # the engine's, where it reports one
    prompt_token_ids: list[int] | None = None  # the engine's prompt (chat endpoint, first chunk)


def sampling_fields(sampling: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """The request fields of the sampling parameters (those set), with ``max_tokens``."""
    body: dict[str, Any] = {"max_tokens": max_tokens}
    for name in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    return body


def upstream_error(status: int, raw: str, retry_after: str | None) -> ProxyError:
    try:
        detail = json.loads(raw)
        message = detail.get("error", {}).get("message") or detail.get("message") or raw
    except (json.JSONDecodeError, AttributeError):
        message = raw
    return ProxyError(
        status, f"upstream error: {message}"[:2000], retry_after=retry_after, code="upstream_error"
    )


class PooledClient:
    """One aiohttp session to the engine, made on first use (inside the event loop).

    aiohttp is the cheaper client per request (the figure: ``bench/RESULTS.md``, "Figures behind
    the proxy's design choices"). Idle connections are closed after :data:`KEEPALIVE_S`, under
    the 5 s that uvicorn (vLLM's server) keeps one open, so a pooled connection is not one the
    upstream has just closed."""

    def __init__(self, timeout: float, api_key: str = "", limit: int = 512) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit, keepalive_timeout=KEEPALIVE_S),
            )
        return self._session

    async def post(self, url: str, data: bytes) -> aiohttp.ClientResponse:
        """Send the request; a pooled connection the upstream closed meanwhile (the request
        could not be written, or the server hung up before answering) is retried on another
        connection, up to :data:`STALE_RETRIES` times: nothing has reached the harness yet."""
        headers = {"content-type": "application/json"}
        for _ in range(STALE_RETRIES):  # each stale pooled connection fails once, then is gone
            try:
                return await self.session().post(url, data=data, headers=headers)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                continue
        return await self.session().post(url, data=data, headers=headers)

    async def stream(
        self, url: str, body: bytes, read: Callable[[list[bytes]], Iterator[Chunk]]
    ) -> AsyncGenerator[Chunk, None]:
        """POST ``body`` and stream the answer's server-sent events, ``read`` turning the lines
        of each network read into chunks (an event cut off by a read is completed by the
        next); the upstream's errors as ProxyErrors, its HTTP status kept."""
        try:
            async with await self.post(url, body) as resp:
                if resp.status >= 400:
                    raise upstream_error(
                        resp.status, await resp.text(), resp.headers.get("retry-after")
                    )
                pending = b""
                async for data in resp.content.iter_any():
                    lines = (pending + data).split(b"\n")
                    pending = lines.pop()
                    for chunk in read(lines):
                        yield chunk
                for chunk in read([pending]):
                    yield chunk
        except TimeoutError as exc:
            raise ProxyError(504, f"upstream timed out: {exc!r}", code="upstream_timeout") from exc
        except aiohttp.ClientPayloadError as exc:
            raise ProxyError(
                502, f"upstream stream broke off: {exc!r}", code="upstream_stream_broken"
            ) from exc
        except aiohttp.ClientError as exc:
            raise ProxyError(
                502, f"upstream unreachable: {exc!r}", code="upstream_unreachable"
            ) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
