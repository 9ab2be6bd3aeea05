"""Tool calls: parsing the engine's text, and the round trip through each dialect.

What a harness resends of our answer must be recognised as exactly our answer, or continuity
breaks on every tool call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.canonical import Generation, ToolCall
from proxy.dialects import ResponseMeta, chat, messages, responses
from proxy.toolparse import ToolCallStream, parse_text
from schemas.enums import Dialect

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


def _generation(content: str) -> Generation:
    return Generation(
        token_ids=[1, 2],
        logprobs=[-1.0, -2.0],
        content=content,
        prompt_tokens=5,
        tool_calls=[ToolCall("call_abc", "shell", '{"cmd": "ls -la"}')],
    )


def _resend(dialect: Dialect, answer: dict[str, Any]) -> dict[str, Any]:
    """What a harness sends next: the history, our answer as it received it, a tool result."""
    if dialect is Dialect.CHAT:
        msg = answer["choices"][0]["message"]
        return {
            "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                msg,
                {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"},
            ],
        }
    if dialect is Dialect.RESPONSES:
        call = next(o for o in answer["output"] if o["type"] == "function_call")
        return {
            "model": "m",
            "input": [
                {"role": "user", "content": "go"},
                *answer["output"],
                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"},
            ],
        }
    use = next(b for b in answer["content"] if b["type"] == "tool_use")
    return {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}],
            },
        ],
    }


@pytest.mark.parametrize("content", ["", "I will list files."])
@pytest.mark.parametrize("dialect", list(Dialect), ids=[d.value for d in Dialect])
def test_our_answer_comes_back_as_exactly_our_answer(dialect: Dialect, content: str) -> None:
    module = {Dialect.CHAT: chat, Dialect.RESPONSES: responses, Dialect.MESSAGES: messages}[dialect]
    gen = _generation(content)
    history = (
        {"input": "go"}
        if dialect is Dialect.RESPONSES
        else {"messages": [{"role": "user", "content": "go"}]}
    )
    first = module.parse({"model": "m", "max_tokens": 5, **history})
    answer = json.loads(json.dumps(module.respond(gen, first, ResponseMeta("id1", "m"))))
    again = module.parse(_resend(dialect, answer))
    assert again.messages[1] == gen.assistant_message()
    assert again.messages[2] == {"role": "tool", "tool_call_id": "call_abc", "content": "ok"}
