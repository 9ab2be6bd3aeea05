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

import orjson

from proxy.canonical import Message
from proxy.chunk import Chunk, PooledClient, sampling_fields
from proxy.errors import ProxyError
from proxy.images import upstream_messages
from schemas.completion import SamplingParams


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
        **sampling_fields(sampling, max_tokens),
    }
    if tools:
        body["tools"], body["tool_choice"] = tools, "none"
    return body


class ChatEndpoint:
    """``POST {base_url}/v1/chat/completions``, streamed, over ``client`` (shared with the
    token-in path where it uses aiohttp too)."""

    def __init__(self, base_url: str, client: PooledClient) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self._client = client

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
        async for chunk in self._client.stream(self.url, body, read_chat_events):
            yield chunk


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
