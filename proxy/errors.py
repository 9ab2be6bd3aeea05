"""Errors the proxy returns, rendered as JSON in the caller's dialect.

OpenAI dialects (Chat Completions, Responses) get ``{"error": {"message", "type", "param",
"code"}}``; Anthropic Messages gets ``{"type": "error", "error": {"type", "message"}}``. Upstream
errors keep their status and ``Retry-After`` so a harness retries as it would in production.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from schemas.enums import Dialect
from schemas.errors import OpenForgeError

# HTTP status -> (OpenAI error type, Anthropic error type)
_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    408: ("timeout_error", "timeout_error"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    502: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
    504: ("timeout_error", "timeout_error"),
    529: ("server_error", "overloaded_error"),
}


class ProxyError(OpenForgeError):
    """An error answered to the harness with ``status`` in its dialect."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


def error_type(status: int, dialect: Dialect) -> str:
    openai, anthropic = _TYPES.get(status, _TYPES[500] if status >= 500 else _TYPES[400])
    return anthropic if dialect is Dialect.MESSAGES else openai


def error_body(error: ProxyError, dialect: Dialect) -> dict[str, Any]:
    kind = error_type(error.status, dialect)
    if dialect is Dialect.MESSAGES:
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    return {
        "error": {"message": error.message, "type": kind, "param": error.param, "code": error.code}
    }


def error_response(error: ProxyError, dialect: Dialect) -> JSONResponse:
    headers = {"retry-after": error.retry_after} if error.retry_after else None
    return JSONResponse(error_body(error, dialect), status_code=error.status, headers=headers)


def stream_error_event(error: ProxyError, dialect: Dialect) -> bytes:
    """An in-band SSE error for a stream that already started."""
    body = error_body(error, dialect)
    if dialect is Dialect.MESSAGES:
        return f"event: error\ndata: {json.dumps(body)}\n\n".encode()
    if dialect is Dialect.RESPONSES:
        event = {"type": "error", "code": body["error"]["type"], "message": error.message}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()
    return f"data: {json.dumps(body)}\n\n".encode()
