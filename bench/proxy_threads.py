"""Multi-turn conversations as a harness plays them, in each of the three dialects.

A :class:`Conversation` is one thread: a long system prompt and a set of tools (sized to a token
budget, like the 17k-31k-token prompts real harnesses send), then one new user message per turn.
Each turn the whole history is resent with the assistant's previous answer exactly as it was
streamed back (text parsed out of the dialect's own stream events), so a proxy that tracks
continuity sees an exact continuation, never a retry of the same body.

``body(dialect)`` serialises the history in a dialect; ``answer_text(dialect, raw)`` reads the
answer's text back out of a streamed response; ``record_answer`` appends it to the history.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from schemas.enums import Dialect

# Words for generated prose: a coding harness's system prompt, tool docs and user turns.
WORDS = (
    "the repository test suite failing function module import error trace stack file line "
    "patch diff commit branch review build compile runtime value type argument return class "
    "method config option flag default environment variable path directory shell command "
    "output exit status retry timeout network request response header body json schema field "
    "parser token cache buffer stream socket process thread lock queue event handler callback "
    "always never before after unless carefully briefly exactly only first then finally check "
    "run read write edit search replace create delete list explain summarise verify confirm "
    "user assistant tool agent task goal plan step note warning safety policy permission"
).split()

TOOL_NAMES = (
    "shell", "read_file", "write_file", "apply_patch", "search", "list_dir", "web_fetch",
    "run_tests", "git_status", "git_diff", "todo_write", "ask_user",
)  # fmt: skip

MAX_TOKENS = 16  # the fast upstream generates this many tokens per answer


def prose(rng: random.Random, words: int) -> str:
    """Sentences of ``words`` words drawn from :data:`WORDS`."""
    out: list[str] = []
    while len(out) < words:
        n = rng.randint(6, 16)
        sentence = [rng.choice(WORDS) for _ in range(n)]
        sentence[0] = sentence[0].capitalize()
        out += sentence
        out[-1] += "."
    return " ".join(out[:words])


def tools(rng: random.Random, doc_words: int, n: int) -> list[dict[str, Any]]:
    """``n`` function tools in Chat Completions' shape, each with a ``doc_words``-word description
    (and parameters described in a quarter as many words each)."""
    arg = max(3, doc_words // 4)
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": prose(rng, doc_words),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": prose(rng, arg)},
                        "command": {"type": "string", "description": prose(rng, arg)},
                        "timeout_ms": {"type": "integer", "description": prose(rng, arg)},
                    },
                    "required": ["command"],
                },
            },
        }
        for name in TOOL_NAMES[:n]
    ]


@dataclass(frozen=True)
class Prompt:
    """What every thread of one history size starts with (shared, as harnesses share theirs)."""

    system: str
    tools: list[dict[str, Any]]

    @classmethod
    def sized(cls, words: int, seed: int = 0) -> Prompt:
        """About ``words`` words: a system prompt, and tools documented in a third as many (one
        tool per 700 words, up to 12: the harnesses send 10-30)."""
        rng = random.Random(seed)
        n = min(len(TOOL_NAMES), max(1, words // 700))
        doc = max(4, words // 3 // n * 4 // 7)  # 7/4: a description and 3 arguments
        return cls(prose(rng, max(20, words - words // 3)), tools(rng, doc, n))


@dataclass
class Conversation:
    """One thread: the shared prompt, then the turns so far (chat-shaped messages)."""

    prompt: Prompt
    seed: int
    model: str
    turns: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def next_user(self) -> None:
        """Append a new user message (a test log, a follow-up instruction)."""
        n = len(self.turns) // 2
        text = f"Turn {n}: " + prose(self._rng, self._rng.randint(20, 60))
        self.turns.append({"role": "user", "content": text})

    def record_answer(self, text: str) -> None:
        self.turns.append({"role": "assistant", "content": text})

    def body(self, dialect: Dialect) -> dict[str, Any]:
        """The request a harness of ``dialect`` sends for the history so far (streaming)."""
        p = self.prompt
        if dialect is Dialect.CHAT:
            return {
                "model": self.model,
                "stream": True,
                "max_tokens": MAX_TOKENS,
                "messages": [{"role": "system", "content": p.system}, *self.turns],
                "tools": p.tools,
            }
        if dialect is Dialect.RESPONSES:
            kind = {"user": "input_text", "assistant": "output_text"}
            return {
                "model": self.model,
                "stream": True,
                "store": False,
                "max_output_tokens": MAX_TOKENS,
                "instructions": p.system,
                "input": [
                    {
                        "type": "message",
                        "role": t["role"],
                        "content": [{"type": kind[t["role"]], "text": t["content"]}],
                    }
                    for t in self.turns
                ],
                "tools": [{"type": "function", **t["function"]} for t in p.tools],
            }
        return {
            "model": self.model,
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "system": p.system,
            "messages": [
                {"role": t["role"], "content": [{"type": "text", "text": t["content"]}]}
                for t in self.turns
            ],
            "tools": [
                {
                    "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"],
                }
                for t in p.tools
            ],
        }


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                out.append(json.loads(data))
    return out


def answer_text(dialect: Dialect, raw: bytes) -> str:
    """The answer's text, read from a streamed response in ``dialect`` (its own event types)."""
    parts: list[str] = []
    for ev in _events(raw):
        if "error" in ev and ev.get("type") in (None, "error"):
            raise RuntimeError(f"the stream carried an error: {ev['error']}")
        if dialect is Dialect.CHAT:
            for choice in ev.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
        elif dialect is Dialect.RESPONSES:
            if ev.get("type") == "response.output_text.delta":
                parts.append(ev["delta"])
        elif ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
            parts.append(ev["delta"]["text"])
    return "".join(parts)
