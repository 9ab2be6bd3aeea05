"""The dialect registry: every dialect registered under its name, bad names refused, and each
dialect's tool calls round-trip.

What a harness resends of our answer must be recognised as exactly our answer, or continuity
breaks on every tool call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical import Generation, ToolCall
from proxy.dialects.base import ResponseMeta
from proxy.dialects.registry import DIALECTS, dialect_for
from proxy.errors import ProxyError
from schemas.enums import Dialect
from schemas.errors import ConfigError


def test_every_dialect_is_registered_under_its_own_name() -> None:
    assert DIALECTS.names() == sorted(d.value for d in Dialect)
    for name in Dialect:
        assert DIALECTS.get(name).name is name
    paths = [DIALECTS.get(name).path for name in Dialect]
    assert len(set(paths)) == len(paths)


def test_a_bad_dialect_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown dialect 'klingon': choose one of chat, "):
        DIALECTS.get("klingon")
    with pytest.raises(ConfigError) as info:
        DIALECTS.get("klingon")
    assert all(d.value in str(info.value) for d in Dialect)


def test_shared_routes_take_the_callers_dialect() -> None:
    assert dialect_for("/v1/models", {"anthropic-version": "2023-06-01"}).name is Dialect.MESSAGES
    assert dialect_for("/rollout/r/v1/messages", {}).name is Dialect.MESSAGES
    assert dialect_for("/v1/models", {}).name is Dialect.CHAT
    error = ProxyError(413, "too big")
    assert DIALECTS.get(Dialect.MESSAGES).error_body(error)["error"]["type"] == "request_too_large"
    assert DIALECTS.get(Dialect.CHAT).error_body(error)["error"]["type"] == "invalid_request_error"


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
    module = DIALECTS.get(dialect)
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
