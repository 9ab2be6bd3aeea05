"""Parse the engine's text into content and tool calls (hermes / Qwen format), also streaming.

The model writes ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`` blocks after
optional content. A block whose JSON does not parse stays in the content: the harness sees exactly
what the model wrote, and nothing is invented.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.canonical import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse_block(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", {})
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(id=new_call_id(), name=data["name"], arguments=arguments)


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    call: ToolCall


class ToolCallStream:
    """Feed text deltas; get content deltas as soon as they are safe, tool calls when complete.

    Content that might be the start of ``<tool_call>`` is held back until it is decided.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self.content = ""
        self.calls: list[ToolCall] = []
        self._pending_ws = ""

    def feed(self, text: str) -> Iterator[TextDelta | ToolCallDelta]:
        self._buf += text
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE)
                if end < 0:
                    return
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE) :]
                self._in_call = False
                call = _parse_block(body)
                if call is None:  # not a real tool call: it was content after all
                    yield from self._emit(OPEN + body + CLOSE)
                else:
                    self.calls.append(call)
                    yield ToolCallDelta(call)
                continue
            start = self._buf.find(OPEN)
            if start >= 0:
                before, self._buf = self._buf[:start], self._buf[start + len(OPEN) :]
                self._in_call = True
                yield from self._emit(before)
                continue
            # Hold back a tail that could still grow into "<tool_call>".
            hold = next(
                (
                    k
                    for k in range(min(len(OPEN) - 1, len(self._buf)), 0, -1)
                    if OPEN.startswith(self._buf[-k:])
                ),
                0,
            )
            safe, self._buf = self._buf[: len(self._buf) - hold], self._buf[len(self._buf) - hold :]
            yield from self._emit(safe)
            return

    def _emit(self, text: str) -> Iterator[TextDelta]:
        # Trailing whitespace waits for what follows: content goes on after it, or, at the end
        # of a turn with tool calls, it is dropped. Decided on the text alone, not on chunking.
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body) :]
        if body:
            self.content += body
            yield TextDelta(body)

    def close(self) -> Iterator[TextDelta | ToolCallDelta]:
        """End of text: an unterminated block is parsed if it is complete JSON, else content."""
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            call = _parse_block(rest)
            if call is not None:
                self.calls.append(call)
                yield ToolCallDelta(call)
                return
            rest = OPEN + rest
        yield from self._emit(rest)
        if self._pending_ws and not self.calls:
            self.content += self._pending_ws
            yield TextDelta(self._pending_ws)
        self._pending_ws = ""


def parse_text(text: str) -> tuple[str, list[ToolCall]]:
    """Content and tool calls of a whole text."""
    stream = ToolCallStream()
    for _ in stream.feed(text):
        pass
    for _ in stream.close():
        pass
    return stream.content, stream.calls
