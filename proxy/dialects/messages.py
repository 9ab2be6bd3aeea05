"""Anthropic Messages (https://docs.anthropic.com/en/api/messages).

``tool_use`` blocks map onto canonical tool calls (arguments = the input as JSON text),
``tool_result`` blocks onto tool messages, ``system`` onto a system message. ``thinking`` blocks
carry no tokens we render here and are skipped (they stay in the recorded body); image blocks
become image parts (:mod:`proxy.images`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy import images
from proxy.canonical import CallRequest, Generation, Message, ToolCall, text_of
from proxy.dialects.base import ResponseMeta, error_type, sse
from proxy.dialects.fields import number, require, sampling_from
from proxy.errors import ProxyError
from schemas.enums import Dialect

# HTTP status -> Anthropic error type
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _blocks(content: Any, i: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    require(
        isinstance(content, list), f"messages[{i}].content must be a string or a list", "messages"
    )
    for block in content:
        require(
            isinstance(block, dict) and isinstance(block.get("type"), str),
            f"messages[{i}].content blocks need a type",
            "messages",
        )
    return list(content)


def _messages(raw: list[Any]) -> list[Message]:
    out: list[Message] = []
    for i, message in enumerate(raw):
        require(
            isinstance(message, dict) and message.get("role") in ("user", "assistant", "system"),
            f"messages[{i}].role must be 'user', 'assistant' or 'system'",
            "messages",
        )
        blocks = _blocks(message.get("content"), i)
        where = f"messages[{i}].content"
        text = images.content(
            [b for b in blocks if b["type"] in ("text", *images.IMAGE_PARTS)], where, "messages"
        )
        if message["role"] == "system":  # mid-conversation context (Claude Code sends these)
            out.append({"role": "system", "content": text})
            continue
        if message["role"] == "assistant":
            msg: Message = {"role": "assistant", "content": text}
            calls = [b for b in blocks if b["type"] == "tool_use"]
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": str(b.get("id", "")),
                        "type": "function",
                        "function": {
                            "name": str(b.get("name", "")),
                            "arguments": json.dumps(b.get("input", {}), ensure_ascii=False),
                        },
                    }
                    for b in calls
                ]
            out.append(msg)
            continue
        for n, block in enumerate(blocks):
            if block["type"] == "tool_result":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": images.content(
                            block.get("content"), f"{where}[{n}].content", "messages"
                        ),
                    }
                )
        if text or not any(b["type"] == "tool_result" for b in blocks):
            out.append({"role": "user", "content": text})
    return out


def parse(body: dict[str, Any]) -> CallRequest:
    model: Any = body.get("model")
    require(isinstance(model, str) and bool(model), "model: Field required", "model")
    require(number(body, "max_tokens", int) is not None, "max_tokens: Field required", "max_tokens")
    raw: Any = body.get("messages")
    require(isinstance(raw, list) and bool(raw), "messages: must be a non-empty list", "messages")
    messages = _messages(raw)
    system = body.get("system")
    require(
        system is None or isinstance(system, str | list),
        "system: must be a string or a list",
        "system",
    )
    if system:
        messages.insert(0, {"role": "system", "content": text_of(system)})
    raw_tools: Any = body.get("tools") or []
    require(isinstance(raw_tools, list), "tools: must be a list", "tools")
    tools = []
    for tool in raw_tools:
        require(
            isinstance(tool, dict) and isinstance(tool.get("name"), str),
            "tools: each needs a name",
            "tools",
        )
        if "input_schema" in tool:  # client tools; server tools (web search...) are skipped
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "parameters": tool["input_schema"],
                    },
                }
            )
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "stream: must be a boolean", "stream")
    return CallRequest(
        dialect=Dialect.MESSAGES,
        model=model,
        messages=messages,
        tools=tools,
        sampling=sampling_from(body, "max_tokens"),
        stream=stream,
    )


def _input(call: ToolCall) -> Any:
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return {"raw": call.arguments}
    return value if isinstance(value, dict) else {"value": value}


def _stop_reason(gen: Generation) -> str:
    return {"tool_calls": "tool_use", "length": "max_tokens"}.get(gen.finish(), "end_turn")


def _usage(gen: Generation, output: int) -> dict[str, int]:
    return {
        "input_tokens": gen.prompt_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def respond(gen: Generation, req: CallRequest, meta: ResponseMeta) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if gen.content:
        content.append({"type": "text", "text": gen.content})
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c)} for c in gen.tool_calls
    ]
    return {
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": _stop_reason(gen),
        "stop_sequence": None,
        "usage": _usage(gen, len(gen.token_ids)),
    }


class Stream:
    """Messages events (``message_start`` ... ``message_stop``) with content blocks."""

    def __init__(self, req: CallRequest, meta: ResponseMeta, prompt_tokens: int = 0) -> None:
        self.req, self.meta = req, meta
        self.prompt_tokens = prompt_tokens
        self._index = -1
        self._text_open = False

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.meta.id,
            "type": "message",
            "role": "assistant",
            "model": self.meta.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.prompt_tokens,
                "output_tokens": 1,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return sse({"type": "message_start", "message": message}, "message_start") + sse(
            {"type": "ping"}, "ping"
        )

    def text(self, delta: str) -> bytes:
        out = b""
        if not self._text_open:
            self._index += 1
            self._text_open = True
            out += sse(
                {
                    "type": "content_block_start",
                    "index": self._index,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            )
        return out + sse(
            {
                "type": "content_block_delta",
                "index": self._index,
                "delta": {"type": "text_delta", "text": delta},
            },
            "content_block_delta",
        )

    def _close_text(self) -> bytes:
        if not self._text_open:
            return b""
        self._text_open = False
        return sse({"type": "content_block_stop", "index": self._index}, "content_block_stop")

    def tool_call(self, call: ToolCall) -> bytes:
        out = self._close_text()
        self._index += 1
        out += sse(
            {
                "type": "content_block_start",
                "index": self._index,
                "content_block": {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": {},
                },
            },
            "content_block_start",
        )
        out += sse(
            {
                "type": "content_block_delta",
                "index": self._index,
                "delta": {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(_input(call), ensure_ascii=False),
                },
            },
            "content_block_delta",
        )
        return out + sse({"type": "content_block_stop", "index": self._index}, "content_block_stop")

    def finish(self, gen: Generation) -> bytes:
        out = self._close_text()
        out += sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(gen), "stop_sequence": None},
                "usage": {"output_tokens": len(gen.token_ids)},
            },
            "message_delta",
        )
        return out + sse({"type": "message_stop"}, "message_stop")


class MessagesDialect:
    """Anthropic Messages as a :class:`~proxy.dialects.base.Dialect`.

    Errors are ``{"type": "error", "error": {"type", "message"}}``, as the Anthropic SDK parses.
    """

    name = Dialect.MESSAGES
    path = "/v1/messages"
    id_prefix = "msg_"

    # This module's functions are the dialect's behaviour.
    parse = staticmethod(parse)
    respond = staticmethod(respond)
    stream = staticmethod(Stream)

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        kind = error_type(error.status, ERROR_TYPES)
        return {"type": "error", "error": {"type": kind, "message": error.message}}

    def stream_error(self, error: ProxyError) -> bytes:
        return f"event: error\ndata: {json.dumps(self.error_body(error))}\n\n".encode()

    def models_body(self, model: str, max_model_len: int) -> dict[str, Any]:
        entry = {
            "type": "model",
            "id": model,
            "display_name": model,
            "created_at": "2026-01-01T00:00:00Z",
        }
        return {"data": [entry], "has_more": False, "first_id": model, "last_id": model}

    def recognizes(self, path: str, headers: Mapping[str, str]) -> bool:
        return "anthropic-version" in headers or "/messages" in path


DIALECT = MessagesDialect()
