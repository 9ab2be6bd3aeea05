"""Calls through the official SDKs, against the proxy in front of real vLLM: every dialect,
streamed or not.

Every recorded event's ids and logprobs are what vLLM generates for the recorded prompt; the first
prompt is vLLM's own rendering of the conversation; a second turn reuses the first call's ids.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anthropic
import openai
import pytest

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import RunningProxy, completions_of, read_events
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, ContinuityClass, Dialect
from tests.proxy.engine import assert_engine_agrees, engine_chat_prompt

TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
SYSTEM = "You are a coding agent."
USER1, USER2 = "List the files in the workspace.", "Now print hello."


def _turn(
    dialect: Dialect, base: str, stream: bool, history: list[Any], seed: int
) -> tuple[str, Any]:
    """One call through the SDK of ``dialect``; returns (text, assistant turn for the history)."""
    if dialect is Dialect.CHAT:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        kw: dict[str, Any] = dict(
            model="agent-model",
            messages=history,
            tools=[TOOL],
            max_tokens=24,
            temperature=1.0,
            seed=seed,
        )
        if stream:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(stream=True, **kw)
                if c.choices
            )
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content or ""
        return text, {"role": "assistant", "content": text}
    if dialect is Dialect.RESPONSES:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        tools = [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a shell command",
                "parameters": TOOL["function"]["parameters"],
            }
        ]
        kw = dict(
            model="agent-model",
            instructions=SYSTEM,
            input=history,
            tools=tools,
            max_output_tokens=24,
            temperature=1.0,
            extra_body={"seed": seed},
        )
        if stream:
            events = list(client.responses.create(stream=True, **kw))
            assert events[0].type == "response.created"
            assert events[-1].type in ("response.completed", "response.incomplete")
            text = events[-1].response.output_text
        else:
            text = client.responses.create(**kw).output_text
        return text, {"role": "assistant", "content": [{"type": "output_text", "text": text}]}
    client_a = anthropic.Anthropic(base_url=base, api_key="unused")
    tools_a = [
        {
            "name": "shell",
            "description": "Run a shell command",
            "input_schema": TOOL["function"]["parameters"],
        }
    ]
    kw = dict(
        model="agent-model",
        system=SYSTEM,
        messages=history,
        tools=tools_a,
        max_tokens=24,
        extra_body={"seed": seed, "temperature": 1.0},
    )
    if stream:
        with client_a.messages.stream(**kw) as s:
            message = s.get_final_message()
    else:
        message = client_a.messages.create(**kw)
    text = "".join(b.text for b in message.content if b.type == "text")
    return text, {"role": "assistant", "content": text} if text else {
        "role": "assistant",
        "content": [{"type": "text", "text": ""}],
    }


def _first_history(dialect: Dialect) -> list[Any]:
    if dialect is Dialect.CHAT:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1}]
    return [{"role": "user", "content": USER1}]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(Dialect), ids=[d.value for d in Dialect])
def test_two_turns_record_exact_engine_tokens(
    proxy: RunningProxy, vllm_server: VLLMServer, dialect: Dialect, stream: bool
) -> None:
    rollout = f"r-{dialect.value}-{stream}-{uuid.uuid4().hex[:6]}"
    base = f"{proxy.url}/rollout/{rollout}"
    history = _first_history(dialect)
    text1, assistant = _turn(dialect, base, stream, history, seed=11)
    history = [*history, assistant, {"role": "user", "content": USER2}]
    text2, _ = _turn(dialect, base, stream, history, seed=12)
    proxy.flush()

    events = completions_of(read_events(proxy.config.log_url, group=rollout, want=2), rollout)
    assert [e.call_index for e in events] == [0, 1]
    first, second = events
    for event in events:
        assert event.status is CompletionStatus.OK
        assert event.dialect is dialect and event.streamed is stream
        assert event.completion_token_ids and len(event.completion_logprobs) == len(
            event.completion_token_ids
        )
        assert event.policy_versions[0].end == len(event.completion_token_ids)

    rebuild = Reconstructor()
    prompt1, body1 = rebuild.add(first)
    prompt2, _ = rebuild.add(second)
    assert body1 is not None and body1["model"] == "agent-model"
    # The first prompt is exactly vLLM's own rendering of the conversation.
    chat_history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1}]
    model = vllm_server.served_model_name
    assert prompt1 == engine_chat_prompt(vllm_server.base_url, model, chat_history, [TOOL])
    # The second prompt continues the first call's prompt and completion ids exactly.
    assert first.continuity is ContinuityClass.FIRST
    assert second.continuity is ContinuityClass.EXACT
    assert (
        prompt2[: len(prompt1) + len(first.completion_token_ids)]
        == prompt1 + first.completion_token_ids
    )
    assert second.prompt_ref_event_id == first.event_id
    # Ids and logprobs are the engine's; the SDK saw the engine's text.
    engine_text1 = assert_engine_agrees(vllm_server.base_url, model, prompt1, first)
    engine_text2 = assert_engine_agrees(vllm_server.base_url, model, prompt2, second)
    assert text1 == engine_text1 and text2 == engine_text2
    assert json.loads(second.response_body or "{}")
