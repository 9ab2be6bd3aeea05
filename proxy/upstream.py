"""The upstream boundary: token ids in, token ids and logprobs out.

Two implementations of one small interface:

- :class:`CompletionsUpstream`: the OpenAI-compatible ``/v1/completions`` endpoint with a prompt
  of token ids and ``return_token_ids`` (vLLM; other OpenAI-compatible engines that return ids).
- :class:`GenerateUpstream`: vLLM's token-in/token-out ``/inference/v1/generate`` endpoint
  (``--enable-scale-out``), which also reports the engine's policy version (vLLM calls it the
  weight version) per span.

Both stream :class:`Chunk` objects; an upstream HTTP error becomes a :class:`ProxyError` that keeps
the upstream's status and ``Retry-After``. :data:`UPSTREAMS` makes one by
:class:`~proxy.config.UpstreamKind`.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any, Protocol

import httpx
import orjson

from proxy.canonical import Message
from proxy.chunk import KEEPALIVE_S, Chunk, PooledClient, sampling_fields, upstream_error
from proxy.config import UpstreamKind
from proxy.errors import ProxyError
from proxy.upstream_chat import ChatEndpoint
from schemas.completion import SamplingParams
from schemas.registry import Registry

__all__ = ["UPSTREAMS", "Chunk", "Upstream"]


class Upstream(abc.ABC):
    """Generates a continuation of a token prompt (:meth:`generate`), or of messages the
    engine renders itself (:meth:`generate_chat`: calls with images)."""

    model: str  # the model name requested upstream
    chat: ChatEndpoint  # the same server's chat endpoint

    @abc.abstractmethod
    def generate(
        self, prompt: list[int], sampling: SamplingParams, max_tokens: int
    ) -> AsyncGenerator[Chunk, None]:
        """Stream the continuation; closing the iterator aborts the upstream request."""

    def generate_chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]],
        sampling: SamplingParams,
        max_tokens: int,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream the answer to ``messages`` rendered by the engine; the first chunk carries
        the prompt ids it used (:mod:`proxy.upstream_chat`)."""
        return self.chat.generate(self.model, messages, tools, sampling, max_tokens)

    @abc.abstractmethod
    async def aclose(self) -> None: ...


async def _raise_for_status(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        raw = (await resp.aread()).decode("utf-8", "replace")
        raise upstream_error(resp.status_code, raw, resp.headers.get("retry-after"))


def _transport_error(exc: httpx.HTTPError) -> ProxyError:
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(504, f"upstream timed out: {exc!r}", code="upstream_timeout")
    return ProxyError(502, f"upstream unreachable: {exc!r}", code="upstream_unreachable")


class _HTTPUpstream(Upstream):
    def __init__(
        self, base_url: str, model: str, timeout: float = 600.0, api_key: str = ""
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=10.0),
            headers=headers,
            # Idle connections closed before the engine's server closes them (uvicorn: 5 s).
            limits=httpx.Limits(
                max_connections=512, max_keepalive_connections=128, keepalive_expiry=KEEPALIVE_S
            ),
        )
        self._pool = PooledClient(timeout, api_key, limit=256)  # the chat path: aiohttp
        self.chat = ChatEndpoint(base_url, self._pool)

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()


class CompletionsUpstream(Upstream):
    """``POST /v1/completions``: a prompt of ids, ``return_token_ids``, logprobs, streaming,
    over a :class:`~proxy.chunk.PooledClient` (aiohttp) shared with the chat path."""

    def __init__(
        self, base_url: str, model: str, timeout: float = 600.0, api_key: str = ""
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._pool = PooledClient(timeout, api_key)
        self.chat = ChatEndpoint(base_url, self._pool)  # one pool for both paths

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def generate(
        self, prompt: list[int], sampling: SamplingParams, max_tokens: int
    ) -> AsyncGenerator[Chunk, None]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "stream": True,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": True,
            **sampling_fields(sampling, max_tokens),
        }
        url = f"{self.base_url}/v1/completions"
        async for chunk in self._pool.stream(url, orjson.dumps(body), _read_chunks):
            yield chunk


_PROMPT_IDS = b'"prompt_token_ids":['


def _without_prompt_ids(data: bytes) -> bytes:
    """The chunk without the prompt's ids that ``return_token_ids`` echoes in the first one:
    the proxy sent them, and parsing tens of thousands of them is most of a call's JSON work.
    (A ``"`` inside a string value is escaped, so the key cannot occur inside text.)"""
    i = data.find(_PROMPT_IDS)
    if i < 0:
        return data
    j = data.find(b"]", i)
    return data[:i] + b'"prompt_token_ids":null' + data[j + 1 :] if j > 0 else data


def _read_chunks(lines: list[bytes]) -> Iterator[Chunk]:
    """The SSE lines of one network read as one chunk: every event the upstream had sent by
    then, merged (ids, logprobs and text in order), so the answer goes out in one write instead
    of one per token. An error event is raised after the chunk of the events before it."""
    chunks: list[Chunk] = []
    error: ProxyError | None = None
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            chunks += _completion_chunks(orjson.loads(_without_prompt_ids(data)))
        except ProxyError as exc:
            error = exc
            break
    if len(chunks) == 1:
        yield chunks[0]
    elif chunks:
        yield Chunk(
            token_ids=[i for c in chunks for i in c.token_ids],
            logprobs=[x for c in chunks for x in c.logprobs],
            text="".join(c.text for c in chunks),
            finish_reason=next(
                (c.finish_reason for c in reversed(chunks) if c.finish_reason), None
            ),
        )
    if error is not None:
        raise error


def _completion_chunks(event: dict[str, Any]) -> list[Chunk]:
    if "error" in event:
        raise ProxyError(502, f"upstream error mid-stream: {event['error']}")
    out = []
    for choice in event.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is None:
            raise ProxyError(
                502, "upstream returned no token ids: it must support return_token_ids (vLLM does)"
            )
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(lps) != len(ids) or any(x is None for x in lps):
            raise ProxyError(  # a guessed logprob would corrupt the off-policy correction
                502,
                f"upstream returned {len(ids)} token ids but logprobs for "
                f"{sum(x is not None for x in lps)}: it must return a logprob per generated "
                "token (vLLM does with logprobs=0)",
                code="upstream_no_logprobs",
            )
        out.append(
            Chunk(
                token_ids=list(ids),
                logprobs=[float(x) for x in lps],
                text=choice.get("text") or "",
                finish_reason=choice.get("finish_reason"),
            )
        )
    return out


class GenerateUpstream(_HTTPUpstream):
    """vLLM's ``POST /inference/v1/generate`` (token-in, token-out; non-streaming).

    Returns ids only; the text comes from the proxy's tokenizer (``decode``), which is fine in
    this direction: generated ids are kept as generated, text is derived for the harness.
    """

    def __init__(
        self, base_url: str, model: str, decode: Callable[[list[int]], str], **kwargs: Any
    ) -> None:
        super().__init__(base_url, model, **kwargs)
        self._decode = decode

    async def generate(
        self, prompt: list[int], sampling: SamplingParams, max_tokens: int
    ) -> AsyncGenerator[Chunk, None]:
        params = {"logprobs": 0, "skip_special_tokens": True}
        params.update(sampling_fields(sampling, max_tokens))
        try:
            resp = await self._client.post(
                "/inference/v1/generate",
                json={"model": self.model, "token_ids": prompt, "sampling_params": params},
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc) from exc
        await _raise_for_status(resp)
        choice = resp.json()["choices"][0]
        ids = list(choice["token_ids"])
        content = (choice.get("logprobs") or {}).get("content") or []
        versions = choice.get("weight_versions") or []  # vLLM's name for policy versions
        version = versions[0].get("version") if versions else None
        if len(content) != len(ids) or any(c.get("logprob") is None for c in content):
            raise ProxyError(
                502,
                f"upstream returned {len(ids)} token ids but {len(content)} logprobs: it must "
                "return a logprob per generated token (vLLM does with logprobs=0)",
                code="upstream_no_logprobs",
            )
        yield Chunk(
            token_ids=ids,
            logprobs=[float(c["logprob"]) for c in content],
            text=self._decode([i for i in ids]),
            finish_reason=choice.get("finish_reason"),
            policy_version=int(version)
            if isinstance(version, int | str) and str(version).isdigit()
            else None,
        )


class UpstreamFactory(Protocol):
    """Makes an upstream client; ``decode`` turns ids into text for upstreams that send none."""

    def __call__(
        self, base_url: str, model: str, *, timeout: float, decode: Callable[[list[int]], str]
    ) -> Upstream: ...


def _completions(
    base_url: str, model: str, *, timeout: float, decode: Callable[[list[int]], str]
) -> Upstream:
    return CompletionsUpstream(base_url, model, timeout=timeout)


def _generate(
    base_url: str, model: str, *, timeout: float, decode: Callable[[list[int]], str]
) -> Upstream:
    return GenerateUpstream(base_url, model, decode, timeout=timeout)


UPSTREAMS: Registry[UpstreamFactory] = Registry("upstream kind")
UPSTREAMS.add(UpstreamKind.COMPLETIONS, _completions)
UPSTREAMS.add(UpstreamKind.GENERATE, _generate)
