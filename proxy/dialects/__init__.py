"""The three API dialects harnesses speak: parse a request, format a response or a stream.

Each module exposes ``parse(body) -> TurnRequest``, ``respond(gen, req, meta) -> dict`` and a
``Stream`` class whose methods return SSE bytes: ``start()``, ``text(delta)``,
``tool_call(call)``, ``finish(gen)``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import ProxyError
from schemas.completion import SamplingParams


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """Identity of one response: its id, creation time and the model name to report."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def require(cond: bool, message: str, param: str | None = None) -> None:
    if not cond:
        raise ProxyError(400, message, param=param)


def number(body: dict[str, Any], name: str, kind: type = float) -> Any:
    """An optional numeric field, type-checked (bools are not numbers)."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    require(ok, f"'{name}' must be a {'integer' if kind is int else 'number'}", name)
    return kind(value)


def sampling_from(body: dict[str, Any], max_tokens_field: str) -> SamplingParams:
    stop = body.get("stop") if "stop" in body else body.get("stop_sequences")
    if isinstance(stop, str):
        stop = [stop]
    require(
        stop is None or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)),
        "'stop' must be a string or a list of strings",
        "stop",
    )
    return SamplingParams(
        temperature=number(body, "temperature"),
        top_p=number(body, "top_p"),
        top_k=number(body, "top_k", int),
        max_tokens=number(body, max_tokens_field, int),
        seed=number(body, "seed", int),
        stop=list(stop or []),
    )


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    import json

    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
