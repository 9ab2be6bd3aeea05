"""OpenAI Chat Completions (https://platform.openai.com/docs/api-reference/chat)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy import images
from proxy.canonical import CallRequest, Generation, Message, ToolCall
from proxy.dialects import openai_common
from proxy.dialects.base import ResponseMeta, sse
from proxy.dialects.fields import number, require, sampling_from
from proxy.errors import ProxyError
from schemas.enums import Dialect

ROLES = {"system", "developer", "user", "assistant", "tool"}


def _message(raw: Any, i: int) -> Message:
    require(isinstance(raw, dict), f"messages[{i}] must be an object", "messages")
    role = raw.get("role")
    require(
        isinstance(role, str) and role in ROLES,
        f"messages[{i}].role must be one of {sorted(ROLES)}",
        "messages",
    )
    out: Message = {
        "role": "system" if role == "developer" else role,
        "content": images.content(raw.get("content"), f"messages[{i}].content", "messages"),
    }
    if role == "assistant" and raw.get("tool_calls"):
        calls = raw["tool_calls"]
        require(isinstance(calls, list), f"messages[{i}].tool_calls must be a list", "messages")
        out["tool_calls"] = []
        for call in calls:
            fn: Any = call.get("function") if isinstance(call, dict) else None
            require(
                isinstance(fn, dict) and isinstance(fn.get("name"), str),
                f"messages[{i}].tool_calls needs function.name",
                "messages",
            )
            args = fn.get("arguments", "")
            out["tool_calls"].append(
                {
                    "id": str(call.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": fn["name"],
                        "arguments": args if isinstance(args, str) else str(args),
                    },
                }
            )
    if role == "tool":
        out["tool_call_id"] = str(raw.get("tool_call_id", ""))
    return out


def parse(body: dict[str, Any]) -> CallRequest:
    model: Any = body.get("model")
    require(
        isinstance(model, str) and bool(model), "'model' is required and must be a string", "model"
    )
    messages: Any = body.get("messages")
    require(
        isinstance(messages, list) and bool(messages),
        "'messages' must be a non-empty list",
        "messages",
    )
    n = number(body, "n", int)
    require(n in (None, 1), "only n=1 is supported", "n")
    tools = body.get("tools") or []
    require(isinstance(tools, list), "'tools' must be a list", "tools")
    for tool in tools:
        require(
            isinstance(tool, dict)
            and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str),
            "each tool needs type 'function' and function.name",
            "tools",
        )
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    max_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return CallRequest(
        dialect=Dialect.CHAT,
        model=model,
        messages=[_message(m, i) for i, m in enumerate(messages)],
        tools=[{"type": "function", "function": t["function"]} for t in tools],
        sampling=sampling_from(body, max_field),
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


def _tool_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out = call.as_message_part()
    if index is not None:
        out = {"index": index, **out}
    return out


def _usage(gen: Generation) -> dict[str, int]:
    n = len(gen.token_ids)
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": gen.prompt_tokens + n,
    }


def respond(gen: Generation, req: CallRequest, meta: ResponseMeta) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": gen.content or None}
    if gen.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in gen.tool_calls]
    return {
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": gen.finish()}
        ],
        "usage": _usage(gen),
    }


class Stream:
    """Chat Completions chunks (``chat.completion.chunk``), ending in ``data: [DONE]``."""

    def __init__(self, req: CallRequest, meta: ResponseMeta, prompt_tokens: int = 0) -> None:
        self.req, self.meta = req, meta
        self._calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse(
            {
                "id": self.meta.id,
                "object": "chat.completion.chunk",
                "created": self.meta.created,
                "model": self.meta.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str) -> bytes:
        return self._chunk({"content": delta})

    def tool_call(self, call: ToolCall) -> bytes:
        self._calls += 1
        return self._chunk({"tool_calls": [_tool_call(call, self._calls - 1)]})

    def finish(self, gen: Generation) -> bytes:
        out = self._chunk({}, gen.finish())
        if self.req.include_usage:
            out += sse(
                {
                    "id": self.meta.id,
                    "object": "chat.completion.chunk",
                    "created": self.meta.created,
                    "model": self.meta.model,
                    "choices": [],
                    "usage": _usage(gen),
                }
            )
        return out + b"data: [DONE]\n\n"


class ChatDialect:
    """OpenAI Chat Completions as a :class:`~proxy.dialects.base.Dialect`."""

    name = Dialect.CHAT
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl-"

    # This module's functions are the dialect's behaviour.
    parse = staticmethod(parse)
    respond = staticmethod(respond)
    stream = staticmethod(Stream)

    error_body = staticmethod(openai_common.error_body)

    def stream_error(self, error: ProxyError) -> bytes:
        return f"data: {json.dumps(self.error_body(error))}\n\n".encode()

    models_body = staticmethod(openai_common.models_body)

    def recognizes(self, path: str, headers: Mapping[str, str]) -> bool:
        return False  # the default for shared routes; see proxy.dialects.registry


DIALECT = ChatDialect()
