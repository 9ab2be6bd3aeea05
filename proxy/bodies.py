"""Reading a request body: its size before and while it is read, its time, and its JSON.

Every check fails with a ProxyError the route renders in the caller's dialect:

- 413 past the byte limit: a declared ``Content-Length`` is checked before anything is read, a
  chunked body while it streams in;
- 408 when the client sends the body slower than ``body_timeout`` seconds in all (a slow client
  holds a connection and a concurrency slot otherwise);
- 400 for a body that is not a JSON object, is nested deeper than ``MAX_DEPTH``, holds ``NaN``
  or ``Infinity`` or a number that overflows a float, an integer of more digits than Python
  parses, or a string that is not valid unicode (a lone surrogate such as ``"\\ud800"``).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

from proxy.errors import ProxyError

MAX_DEPTH = 128  # JSON nesting: a tool's schema nests a few dozen levels at most


def _reject_constant(name: str) -> float:
    raise ProxyError(400, f"request body holds {name}: JSON numbers must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProxyError(
            400, f"request body holds {text[:40]}, beyond a float64: send a smaller number"
        )
    return value


def _check_tree(body: Any) -> None:
    """Depth and unicode of a parsed body, iteratively (a deep body must not recurse here)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise ProxyError(
                        400,
                        "request body holds a string that is not valid unicode "
                        "(a lone surrogate): send UTF-8 text",
                    ) from None
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise ProxyError(400, f"request body is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        else:
            stack.extend((v, depth + 1) for v in value)


_WIDE = float(2**63)  # orjson reads an integer past 64 bits as a float at least this large


def _scan(body: Any) -> bool:
    """The depth of a body orjson parsed (its strings are valid unicode), and whether it holds a
    float of magnitude 2**63 or more: maybe an integer orjson read as a float. One walk; no
    scan of the raw bytes (on a 30k-token body that scan cost twice orjson's parse)."""
    if not isinstance(body, dict | list):
        return type(body) is float and abs(body) >= _WIDE
    wide = False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProxyError(400, f"request body is nested deeper than {MAX_DEPTH} levels")
        for v in value.values() if isinstance(value, dict) else value:
            if isinstance(v, dict | list):
                stack.append((v, depth + 1))
            elif type(v) is float and not wide:
                wide = abs(v) >= _WIDE
    return wide


def parse_json(raw: bytes) -> Any:
    """A body's JSON value, checked as the module says. orjson parses it where it can (it
    rejects what the checks reject, but reads an integer past 64 bits as a float: a body with
    such a float, and every body orjson rejects, goes through the standard library, which keeps
    such integers and gives the error message)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if not _scan(value):
            return value
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ProxyError(400, f"request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, too many digits
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from None
    _check_tree(value)
    return value


async def read_raw(request: Request, limit: int, timeout: float) -> bytes:
    """The body's bytes: 413 past ``limit``, 408 if it takes longer than ``timeout`` seconds."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                raw += part
                if len(raw) > limit:
                    raise ProxyError(413, f"request body exceeds the {limit}-byte limit")
    except TimeoutError:
        raise ProxyError(
            408, f"the request body did not arrive within {timeout:g} s", code="body_timeout"
        ) from None
    except ClientDisconnect:
        raise ProxyError(400, "the client went away while sending the body") from None
    return bytes(raw)


async def read_object(
    request: Request, limit: int, timeout: float, *, optional: bool = False
) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty body when ``optional``)."""
    raw = await read_raw(request, limit, timeout)
    if optional and not raw.strip():
        return {}
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ProxyError(400, "request body must be a JSON object")
    return body
