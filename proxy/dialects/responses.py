"""OpenAI Responses (https://platform.openai.com/docs/api-reference/responses).

Input items map onto canonical messages: ``message`` items by role, ``function_call`` (and
``custom_tool_call``) items onto the preceding assistant message's tool calls,
``*_call_output`` items onto tool messages. ``reasoning`` and hosted-tool items carry no tokens we
render and are skipped (they stay in the recorded request body).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy import images
from proxy.canonical import CallRequest, Generation, Message, ToolCall
from proxy.dialects import openai_common
from proxy.dialects.base import ResponseMeta, new_id, sse
from proxy.dialects.fields import require, sampling_from
from proxy.errors import ProxyError
from schemas.enums import Dialect

CUSTOM_PARAMS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


def _add_call(messages: list[Message], call: dict[str, Any]) -> None:
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    messages[-1].setdefault("tool_calls", []).append(call)


def _messages(items: list[Any]) -> list[Message]:
    messages: list[Message] = []
    for i, item in enumerate(items):
        require(isinstance(item, dict), f"input[{i}] must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            require(
                role in ("user", "assistant", "system", "developer"),
                f"input[{i}].role must be user, assistant, system or developer",
                "input",
            )
            role = "system" if role == "developer" else role
            value = images.content(item.get("content"), f"input[{i}].content", "input")
            messages.append({"role": role, "content": value})
        elif kind == "function_call":
            require(
                isinstance(item.get("name"), str), f"input[{i}] function_call needs a name", "input"
            )
            _add_call(
                messages,
                {
                    "id": str(item.get("call_id", "")),
                    "type": "function",
                    "function": {"name": item["name"], "arguments": str(item.get("arguments", ""))},
                },
            )
        elif kind == "custom_tool_call":
            _add_call(
                messages,
                {
                    "id": str(item.get("call_id", "")),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name", "")),
                        "arguments": json.dumps({"input": item.get("input", "")}),
                    },
                },
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id", "")),
                    "content": output
                    if isinstance(output, str)
                    else images.content(output, f"input[{i}].output", "input"),
                }
            )
    return messages


def _tools(raw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    require(raw is None or isinstance(raw, list), "'tools' must be a list", "tools")
    tools, custom = [], []
    for tool in raw or []:
        require(isinstance(tool, dict), "each tool must be an object", "tools")
        if tool.get("type") == "function":
            require(isinstance(tool.get("name"), str), "function tools need a name", "tools")
            fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
            tools.append({"type": "function", "function": fn})
        elif tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            custom.append(tool["name"])
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "parameters": CUSTOM_PARAMS,
                    },
                }
            )
    return tools, custom


def parse(body: dict[str, Any]) -> CallRequest:
    model: Any = body.get("model")
    require(
        isinstance(model, str) and bool(model), "'model' is required and must be a string", "model"
    )
    require(
        body.get("previous_response_id") is None,
        "previous_response_id is not supported: send the full input (store=false)",
        "previous_response_id",
    )
    raw: Any = body.get("input")
    require(isinstance(raw, str | list), "'input' must be a string or a list of items", "input")
    messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else _messages(raw)
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    require(bool(messages), "'input' holds no message", "input")
    tools, custom = _tools(body.get("tools"))
    stream = body.get("stream", False)
    require(isinstance(stream, bool), "'stream' must be a boolean", "stream")
    return CallRequest(
        dialect=Dialect.RESPONSES,
        model=model,
        messages=messages,
        tools=tools,
        sampling=sampling_from(body, "max_output_tokens"),
        stream=stream,
        extra={"custom_tools": custom, "metadata": body.get("metadata") or {}},
    )


def _call_item(call: ToolCall, req: CallRequest, item_id: str, done: bool) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    if call.name in req.extra.get("custom_tools", []):
        try:
            text = json.loads(call.arguments).get("input", call.arguments)
        except (json.JSONDecodeError, AttributeError):
            text = call.arguments
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call.id,
            "name": call.name,
            "input": text if done else "",
            "status": status,
        }
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if done else "",
        "status": status,
    }


def _message_item(item_id: str, text: str, done: bool) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
    return {
        "type": "message",
        "id": item_id,
        "status": "completed" if done else "in_progress",
        "role": "assistant",
        "content": content,
    }


def _usage(gen: Generation) -> dict[str, Any]:
    n = len(gen.token_ids)
    return {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + n,
    }


def _response(
    meta: ResponseMeta,
    req: CallRequest,
    output: list[dict[str, Any]],
    status: str,
    gen: Generation | None,
) -> dict[str, Any]:
    incomplete = gen is not None and gen.finish() == "length"
    return {
        "id": meta.id,
        "object": "response",
        "created_at": meta.created,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": req.extra.get("metadata", {}),
        "usage": _usage(gen) if gen is not None else None,
    }


def respond(gen: Generation, req: CallRequest, meta: ResponseMeta) -> dict[str, Any]:
    output = []
    if gen.content:
        output.append(_message_item(new_id("msg_"), gen.content, done=True))
    output += [_call_item(c, req, new_id("fc_"), done=True) for c in gen.tool_calls]
    return _response(meta, req, output, "completed", gen)


class Stream:
    """Responses events (``response.created`` ... ``response.completed``), numbered in order."""

    def __init__(self, req: CallRequest, meta: ResponseMeta, prompt_tokens: int = 0) -> None:
        self.req, self.meta = req, meta
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._msg_id: str | None = None
        self._text = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        self._seq += 1
        return sse({"type": kind, "sequence_number": self._seq, **fields}, event=kind)

    def start(self) -> bytes:
        response = _response(self.meta, self.req, [], "in_progress", None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def text(self, delta: str) -> bytes:
        out = b""
        if self._msg_id is None:
            self._msg_id = new_id("msg_")
            out += self._event(
                "response.output_item.added",
                output_index=len(self._output),
                item=_message_item(self._msg_id, "", done=False),
            )
            out += self._event(
                "response.content_part.added",
                item_id=self._msg_id,
                output_index=len(self._output),
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        self._text += delta
        return out + self._event(
            "response.output_text.delta",
            item_id=self._msg_id,
            output_index=len(self._output),
            content_index=0,
            delta=delta,
        )

    def _close_message(self) -> bytes:
        if self._msg_id is None:
            return b""
        index, item = len(self._output), _message_item(self._msg_id, self._text, done=True)
        out = self._event(
            "response.output_text.done",
            item_id=self._msg_id,
            output_index=index,
            content_index=0,
            text=self._text,
        )
        out += self._event(
            "response.content_part.done",
            item_id=self._msg_id,
            output_index=index,
            content_index=0,
            part=item["content"][0],
        )
        out += self._event("response.output_item.done", output_index=index, item=item)
        self._output.append(item)
        self._msg_id = None
        return out

    def tool_call(self, call: ToolCall) -> bytes:
        out = self._close_message()
        item_id, index = new_id("fc_"), len(self._output)
        done = _call_item(call, self.req, item_id, done=True)
        out += self._event(
            "response.output_item.added",
            output_index=index,
            item=_call_item(call, self.req, item_id, done=False),
        )
        if done["type"] == "custom_tool_call":
            out += self._event(
                "response.custom_tool_call_input.delta",
                item_id=item_id,
                output_index=index,
                delta=done["input"],
            )
            out += self._event(
                "response.custom_tool_call_input.done",
                item_id=item_id,
                output_index=index,
                input=done["input"],
            )
        else:
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=call.arguments,
            )
        out += self._event("response.output_item.done", output_index=index, item=done)
        self._output.append(done)
        return out

    def finish(self, gen: Generation) -> bytes:
        out = self._close_message()
        response = _response(self.meta, self.req, self._output, "completed", gen)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=response)


class ResponsesDialect:
    """OpenAI Responses as a :class:`~proxy.dialects.base.Dialect`."""

    name = Dialect.RESPONSES
    path = "/v1/responses"
    id_prefix = "resp_"

    # This module's functions are the dialect's behaviour.
    parse = staticmethod(parse)
    respond = staticmethod(respond)
    stream = staticmethod(Stream)

    error_body = staticmethod(openai_common.error_body)

    def stream_error(self, error: ProxyError) -> bytes:
        kind = self.error_body(error)["error"]["type"]
        event = {"type": "error", "code": kind, "message": error.message}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()

    models_body = staticmethod(openai_common.models_body)

    def recognizes(self, path: str, headers: Mapping[str, str]) -> bool:
        return False  # its clients look like Chat Completions' on shared routes


DIALECT = ResponsesDialect()
