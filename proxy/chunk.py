"""What an upstream streams back (:class:`Chunk`), and its HTTP errors as ProxyErrors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from proxy.errors import ProxyError


@dataclass(slots=True)
class Chunk:
    """A piece of a generation as the upstream sent it (what one network read brought)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    policy_version: int | None = None  # the engine's, where it reports one
    prompt_token_ids: list[int] | None = None  # the engine's prompt (chat endpoint, first chunk)


def upstream_error(status: int, raw: str, retry_after: str | None) -> ProxyError:
    try:
        detail = json.loads(raw)
        message = detail.get("error", {}).get("message") or detail.get("message") or raw
    except (json.JSONDecodeError, AttributeError):
        message = raw
    return ProxyError(
        status, f"upstream error: {message}"[:2000], retry_after=retry_after, code="upstream_error"
    )
