"""What a simulated user's client sends and reads in each dialect the proxy speaks.

Each dialect's request carries the whole conversation so far (as the harnesses resend it) and
the session identity header that harness sends: Codex's ``session-id`` for Chat Completions and
Responses, Claude Code's ``x-claude-code-session-id`` for Anthropic Messages. Nothing here
names a rollout: in open mode the proxy attributes the call by that header.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from schemas.errors import OpenForgeError


class Dialect(Enum):
    CHAT = "chat"
    RESPONSES = "responses"
    MESSAGES = "messages"


PATHS = {
    Dialect.CHAT: "/v1/chat/completions",
    Dialect.RESPONSES: "/v1/responses",
    Dialect.MESSAGES: "/v1/messages",
}
SESSION_HEADERS = {
    Dialect.CHAT: "session-id",
    Dialect.RESPONSES: "session-id",
    Dialect.MESSAGES: "x-claude-code-session-id",
}


class ReplyError(OpenForgeError):
    """A 200 answer without the reply text its dialect puts there."""


def request(dialect: Dialect, turns: list[tuple[str, str]], max_tokens: int) -> dict[str, Any]:
    """The body of the next call: ``turns`` is the conversation, ``(role, text)`` in order,
    ending with the user's new message."""
    messages = [{"role": role, "content": text} for role, text in turns]
    if dialect is Dialect.CHAT:
        return {"model": "policy", "messages": messages, "max_tokens": max_tokens}
    if dialect is Dialect.RESPONSES:
        return {"model": "policy", "input": messages, "max_output_tokens": max_tokens}
    return {"model": "policy", "messages": messages, "max_tokens": max_tokens}


def headers(dialect: Dialect, session: str) -> dict[str, str]:
    out = {SESSION_HEADERS[dialect]: session}
    if dialect is Dialect.MESSAGES:
        out["anthropic-version"] = "2023-06-01"
    return out


def reply_text(dialect: Dialect, body: dict[str, Any]) -> str:
    """The assistant's text in a 200 answer of ``dialect``."""
    try:
        if dialect is Dialect.CHAT:
            return str(body["choices"][0]["message"].get("content") or "")
        if dialect is Dialect.RESPONSES:
            return "".join(
                part.get("text", "")
                for item in body["output"]
                if item.get("type") == "message"
                for part in item.get("content", [])
            )
        return "".join(b.get("text", "") for b in body["content"] if b.get("type") == "text")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ReplyError(
            f"a {dialect.value} answer without its reply text ({exc!r}): is the base URL a "
            "proxy that speaks this dialect?"
        ) from exc
