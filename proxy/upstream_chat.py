"""The engine's chat endpoint, for calls with images: messages in, the engine's prompt ids,
generated ids and logprobs out.

The proxy's token-in path (:mod:`proxy.upstream`) carries no pixels, so a call with an image is
sent as messages to ``POST /v1/chat/completions`` (vLLM's OpenAI server, the same one that
serves ``/v1/completions``): the engine renders the chat template and runs the model's
processor, which expands each image into its placeholder tokens. ``return_token_ids`` brings
back the prompt ids the engine used (``prompt_token_ids``, in the first event) and the ids of
each generated piece; ``logprobs`` one logprob per generated token. The proxy parses tool calls
from the generated text itself, as on the token-in path, so the tools go to the template with
``tool_choice: "none"`` (no server-side parser; the template still shows them).

Continuity is checked after the fact: the prompt ids the engine reports are compared with the
thread's previous prompt and completion (:meth:`proxy.continuity.Plan.settle_engine_prompt`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import Any

import aiohttp
import orjson

from proxy.canonical import Message
from proxy.chunk import Chunk, upstream_error
from proxy.errors import ProxyError
from proxy.images import upstream_messages
from schemas.completion import SamplingParams

KEEPALIVE_S = 4.0  # under the 5 s uvicorn keeps an idle connection (see proxy.upstream)


def chat_body(
    model: str,
    messages: list[Message],
    tools: list[dict[str, Any]],
    sampling: SamplingParams,
    max_tokens: int,
) -> dict[str, Any]:
    """The chat request for the engine (sampling fields as on the token-in path)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": upstream_messages(messages),
        "stream": True,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": True,
        "max_tokens": max_tokens,
    }
    if tools:
        body["tools"], body["tool_choice"] = tools, "none"
    for name in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    return body


class ChatEndpoint:
    """``POST {base_url}/v1/chat/completions``, streamed."""

    def __init__(self, base_url: str, timeout: float, api_key: str = "") -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10.0)
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def generate(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        sampling: SamplingParams,
        max_tokens: int,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream the generation's chunks; the first carries the engine's prompt ids."""
        body = orjson.dumps(chat_body(model, messages, tools, sampling, max_tokens))
        headers = {"content-type": "application/json"}
        try:
            async with self._client().post(self.url, data=body, headers=headers) as resp:
                if resp.status >= 400:
                    raise upstream_error(
                        resp.status, await resp.text(), resp.headers.get("retry-after")
                    )
                pending = b""
                async for data in resp.content.iter_any():
                    lines = (pending + data).split(b"\n")
                    pending = lines.pop()
                    for chunk in read_chat_events(lines):
                        yield chunk
                for chunk in read_chat_events([pending]):
                    yield chunk
        except TimeoutError as exc:
            raise ProxyError(504, f"upstream timed out: {exc!r}", code="upstream_timeout") from exc
        except aiohttp.ClientError as exc:
            raise ProxyError(
                502, f"upstream unreachable: {exc!r}", code="upstream_unreachable"
            ) from exc


def read_chat_events(lines: list[bytes]) -> Iterator[Chunk]:
    """The chunks of one read's SSE lines (one per event; an error event raises)."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        event = orjson.loads(line[5:].strip())
        if "error" in event:
            raise ProxyError(502, f"upstream error mid-stream: {event['error']}")
        prompt = event.get("prompt_token_ids")
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids")
            text = (choice.get("delta") or {}).get("content") or ""
            if ids is None and not text and not choice.get("logprobs"):
                ids = []  # the opening event (the role) or a closing one: no tokens
            if ids is None:
                raise ProxyError(
                    502,
                    "upstream returned no token ids: its chat endpoint must support "
                    "return_token_ids (vLLM does)",
                )
            content = (choice.get("logprobs") or {}).get("content") or []
            if len(content) != len(ids) or any(c.get("logprob") is None for c in content):
                raise ProxyError(
                    502,
                    f"upstream returned {len(ids)} token ids but {len(content)} logprobs: it "
                    "must return a logprob per generated token (vLLM does with logprobs=true)",
                    code="upstream_no_logprobs",
                )
            yield Chunk(
                token_ids=list(ids),
                logprobs=[float(c["logprob"]) for c in content],
                text=text,
                finish_reason=choice.get("finish_reason"),
                prompt_token_ids=list(prompt) if prompt is not None else None,
            )
            prompt = None
