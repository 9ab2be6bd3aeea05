"""What a dialect is: the :class:`Dialect` protocol every API dialect module implements.

A dialect turns a harness's request body into a :class:`~proxy.canonical.CallRequest`, and a
:class:`~proxy.canonical.Generation` back into that harness's response, stream or error. Adding a
dialect is one module under ``proxy/dialects/`` plus one line in ``proxy/dialects/registry.py``;
the routes, the call lifecycle and the error rendering find it there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.responses import JSONResponse

from proxy.canonical import CallRequest, Generation, ToolCall
from proxy.errors import ProxyError
from schemas import enums


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """Identity of one response: its id, creation time and the model name to report."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))


class StreamEncoder(Protocol):
    """The SSE bytes of one streamed answer.

    Called in the order ``start()``, then ``text`` / ``tool_call`` as the generation streams,
    then ``finish(gen)`` once with the whole generation. Each returns complete SSE events.
    """

    def start(self) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def tool_call(self, call: ToolCall) -> bytes: ...

    def finish(self, gen: Generation) -> bytes: ...


class Dialect(Protocol):
    """One API dialect a harness speaks to the proxy.

    ``parse`` raises a 400 :class:`ProxyError` naming the bad field; everything else is total.
    """

    @property
    def name(self) -> enums.Dialect:
        """The dialect's name, as recorded in completion events (the registry key)."""
        ...

    @property
    def path(self) -> str:
        """The route of its calls under ``/v1`` prefixes, e.g. ``/v1/chat/completions``."""
        ...

    @property
    def id_prefix(self) -> str:
        """Prefix of the response ids it answers with, e.g. ``chatcmpl-``."""
        ...

    def parse(self, body: dict[str, Any]) -> CallRequest:
        """The call's canonical form, or a 400 ProxyError for a malformed body."""
        ...

    def respond(self, gen: Generation, req: CallRequest, meta: ResponseMeta) -> dict[str, Any]:
        """The non-streamed response body for a finished generation."""
        ...

    def stream(self, req: CallRequest, meta: ResponseMeta, prompt_tokens: int) -> StreamEncoder:
        """An encoder for a streamed answer to ``req`` with a prompt of ``prompt_tokens``."""
        ...

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        """The JSON error body, in the shape this dialect's SDKs parse."""
        ...

    def stream_error(self, error: ProxyError) -> bytes:
        """An in-band SSE error event, for a stream whose headers are already sent."""
        ...

    def models_body(self, model: str, max_model_len: int) -> dict[str, Any]:
        """The body of ``GET /v1/models`` listing the one upstream model."""
        ...

    def recognizes(self, path: str, headers: Mapping[str, str]) -> bool:
        """Whether a request to a route shared by all dialects (``/v1/models``, admin routes)
        comes from this dialect's clients, so errors and model lists take its shape."""
        ...


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def error_type(status: int, types: Mapping[int, str]) -> str:
    """The error type for an HTTP status from a dialect's table (400/500 for unlisted ones)."""
    return types.get(status, types[500] if status >= 500 else types[400])


def error_response(error: ProxyError, dialect: Dialect) -> JSONResponse:
    """``error`` as a JSON response in ``dialect``, with its status and ``Retry-After``."""
    headers = {"retry-after": error.retry_after} if error.retry_after else None
    return JSONResponse(dialect.error_body(error), status_code=error.status, headers=headers)
