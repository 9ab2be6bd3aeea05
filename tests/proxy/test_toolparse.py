"""Tool calls: parsing the engine's text into content and calls, whole or streamed.

(The round trip of tool calls through each dialect is in ``tests/proxy/dialects/test_registry.py``.)
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from proxy.toolparse import ToolCallStream, parse_text

CALL = (
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "text": "hi"}}\n'
    "</tool_call>"
)


def test_parse_content_and_calls() -> None:
    content, calls = parse_text("Let me write it.\n" + CALL + "\n" + CALL)
    assert content == "Let me write it."  # trailing whitespace before tool calls is dropped
    assert [c.name for c in calls] == ["write_file", "write_file"]
    assert json.loads(calls[0].arguments) == {"path": "a.txt", "text": "hi"}
    assert calls[0].id != calls[1].id


def test_broken_blocks_stay_content() -> None:
    text = 'x <tool_call>{not json}</tool_call> y <tool_call>{"no_name": 1}</tool_call>'
    assert parse_text(text) == (text, [])
    assert parse_text('<tool_call>{"name": "a", "arguments": {}}')[1][0].name == "a"


@given(st.lists(st.integers(1, 7), min_size=1, max_size=40))
def test_streaming_parse_equals_whole_parse(cuts: list[int]) -> None:
    text = "Sure <3 — " + CALL + " tail <tool_ " + CALL
    stream, pieces, pos = ToolCallStream(), [], 0
    for cut in cuts * 50:
        if pos >= len(text):
            break
        pieces += list(stream.feed(text[pos : pos + cut]))
        pos += cut
    pieces += list(stream.feed(text[pos:]))
    pieces += list(stream.close())
    whole_content, whole_calls = parse_text(text)
    assert stream.content == whole_content
    assert [(c.name, c.arguments) for c in stream.calls] == [
        (c.name, c.arguments) for c in whole_calls
    ]
