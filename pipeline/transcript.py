"""A rollout's session as plain text, from its recorded calls: what a judge reads.

The transcript is the last call of the rollout's main thread (the root thread, not a side call
or a sub-agent's): its full request history, rebuilt from the delta form
(:class:`~schemas.delta.Reconstructor`), then the answer the harness got. Every dialect's items
become ``role: text`` lines; tool calls and tool results are shown by name and arguments.
A rollout whose bodies were not recorded (``--no-bodies``, or redacted) has no transcript.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from schemas.completion import CompletionEvent
from schemas.delta import HISTORY_KEYS, Reconstructor
from schemas.enums import Dialect

_TEXT_KEYS = ("text", "content", "output", "input_text", "output_text")


def transcript(completions: Iterable[CompletionEvent]) -> str | None:
    """The session's transcript (None without a recorded body on its last main call)."""
    calls = sorted(completions, key=lambda e: e.call_index)
    rebuild = Reconstructor()
    last: tuple[CompletionEvent, dict[str, Any] | None] | None = None
    for event in calls:
        body = rebuild.request_body(event)
        if not event.side_call and event.parent_event_id is None:
            last = (event, body)
    if last is None:
        return None
    event, body = last
    if body is None or event.response_body is None:
        return None
    lines = [_line(item) for item in _history(body, event.dialect)]
    lines += _answer(json.loads(event.response_body or "null"), event.dialect)
    return "\n".join(line for line in lines if line)


def _history(body: dict[str, Any], dialect: Dialect) -> list[Any]:
    items: list[Any] = []
    if dialect is Dialect.MESSAGES and body.get("system"):
        items.append({"role": "system", "content": body["system"]})
    if dialect is Dialect.RESPONSES and body.get("instructions"):
        items.append({"role": "system", "content": body["instructions"]})
    history = body.get(HISTORY_KEYS[dialect])
    if isinstance(history, str):  # Responses: one user message as a string
        history = [{"role": "user", "content": history}]
    return items + (history if isinstance(history, list) else [])


def _line(item: Any) -> str:
    if not isinstance(item, dict):
        return f"user: {_text(item)}"
    kind = item.get("type")
    if kind in ("function_call", "tool_use"):
        return f"assistant called {item.get('name')}({_args(item)})"
    if kind in ("function_call_output", "tool_result"):
        return f"tool: {_text(item.get('output', item.get('content')))}"
    role = str(item.get("role") or "user")
    text = _text(item.get("content"))
    calls = [
        f"[called {c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})]"
        for c in item.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    return f"{role}: {' '.join([text, *calls]).strip()}"


def _text(value: Any) -> str:
    """The text in a content value: a string, a list of parts, or a part."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(t for t in (_part(v) for v in value) if t)
    if isinstance(value, dict):
        return _part(value)
    return str(value)


def _part(part: Any) -> str:
    if not isinstance(part, dict):
        return _text(part)
    if part.get("type") in ("tool_use", "function_call"):
        return f"[called {part.get('name')}({_args(part)})]"
    if part.get("type") == "tool_result":
        return f"[tool result: {_text(part.get('content'))}]"
    for key in _TEXT_KEYS:
        if key in part:
            return _text(part[key])
    return ""


def _args(item: dict[str, Any]) -> str:
    args = item.get("arguments", item.get("input"))
    return args if isinstance(args, str) else json.dumps(args, sort_keys=True)


def _answer(response: Any, dialect: Dialect) -> list[str]:
    """The lines of the answer the harness got."""
    if not isinstance(response, dict):
        return []
    if dialect is Dialect.CHAT:
        choices = response.get("choices") or [{}]
        return [_line({"role": "assistant", **(choices[0].get("message") or {})})]
    if dialect is Dialect.RESPONSES:
        return [
            _line({"role": "assistant", **item}) if item.get("type") == "message" else _line(item)
            for item in response.get("output") or []
            if isinstance(item, dict)
        ]
    return [f"assistant: {_text(response.get('content'))}"]
