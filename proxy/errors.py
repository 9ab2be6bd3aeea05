"""The error the proxy answers a harness with.

Each dialect renders it in its own shape (:meth:`proxy.dialects.base.Dialect.error_body`,
:func:`proxy.dialects.base.error_response`). Upstream errors keep their status and
``Retry-After`` so a harness retries as it would in production.
"""

from __future__ import annotations

from schemas.errors import OpenForgeError


class ProxyError(OpenForgeError):
    """An error answered to the harness with HTTP ``status``; ``message`` says what to do next.

    ``param`` names the offending request field, ``code`` is a stable machine-readable reason
    (``context_length_exceeded``, ``upstream_error``, ...), ``retry_after`` the seconds a client
    should wait before retrying (sent as ``Retry-After``).
    """

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
