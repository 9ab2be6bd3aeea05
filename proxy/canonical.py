"""The proxy's one internal form of a call, between the three dialects and the engine.

Messages and tools use OpenAI Chat Completions' shapes (the chat template's native input):
``{"role", "content": str, "tool_calls": [{"id", "type": "function", "function": {"name",
"arguments": str}}], "tool_call_id"}``; tools ``{"type": "function", "function": {"name",
"description", "parameters"}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.completion import SamplingParams
from schemas.enums import Dialect

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as generated

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class CallRequest:
    """One call from a harness, translated out of its dialect."""

    dialect: Dialect
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    sampling: SamplingParams
    stream: bool
    include_usage: bool = False  # Chat Completions' stream_options.include_usage
    extra: dict[str, Any] = field(default_factory=dict)  # dialect fields echoed in the response


@dataclass(slots=True)
class Generation:
    """What the engine generated in one call, plus its parse into content and tool calls."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # engine's: "stop", "length", "abort"
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    policy_version: int | None = None  # the engine's own policy version, where it reports one
    engine_prompt_ids: list[int] | None = None  # the prompt the engine rendered (image calls)

    def assistant_message(self) -> Message:
        """The assistant message as the harness will resend it (canonical form)."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [c.as_message_part() for c in self.tool_calls]
        return message

    def finish(self) -> str:
        """Finish reason in Chat Completions terms."""
        if self.tool_calls:
            return "tool_calls"
        return "length" if self.finish_reason == "length" else "stop"


def text_of(content: Any) -> str:
    """Text of a content value: a string, or a list of text parts of any dialect."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)
