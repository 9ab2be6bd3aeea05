"""What the two OpenAI dialects (Chat Completions, Responses) share: error and model-list shapes.

Errors are ``{"error": {"message", "type", "param", "code"}}``, the shape the OpenAI SDKs parse.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.dialects.base import error_type
from proxy.errors import ProxyError

# HTTP status -> OpenAI error type
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
    529: "server_error",
}


def error_body(error: ProxyError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error_type(error.status, ERROR_TYPES),
            "param": error.param,
            "code": error.code,
        }
    }


def models_body(model: str, max_model_len: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "openforge",
                "max_model_len": max_model_len,
            }
        ],
    }
