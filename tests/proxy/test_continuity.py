"""Thread matching and continuity classes, with the tiny model's real chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.canonical import CallRequest, Generation, ToolCall
from proxy.continuity import ContinuityTracker
from proxy.render import Renderer
from schemas.completion import SamplingParams
from schemas.enums import CompletionStatus, ContinuityClass, Dialect

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
SYS = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "fix the bug"}


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> Renderer:
    return Renderer(tiny_model_dir)


def _req(messages: list[dict[str, Any]], model: str = "main", tools: Any = TOOLS) -> CallRequest:
    return CallRequest(Dialect.CHAT, model, messages, tools, SamplingParams(), False)


def _answer(
    renderer: Renderer,
    tracker: ContinuityTracker,
    req: CallRequest,
    eid: str,
    status: CompletionStatus = CompletionStatus.OK,
) -> tuple[Any, Generation]:
    plan = tracker.plan(req, renderer)
    call = ToolCall(f"call_{eid}", "shell", '{"cmd": "ls"}')
    text = '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'
    gen = Generation(
        token_ids=[*renderer.encode(text), renderer.eos_token_id or 0],
        content="",
        tool_calls=[call],
    )
    tracker.commit(plan, eid, req, gen, status)
    return plan, gen


def test_exact_extension_reuses_prompt_and_completion_ids(renderer: Renderer) -> None:
    tracker = ContinuityTracker("r")
    first, gen = _answer(renderer, tracker, _req([SYS, USER]), "e0")
    history = [
        SYS,
        USER,
        gen.assistant_message(),
        {"role": "tool", "tool_call_id": "call_e0", "content": "a.txt"},
    ]
    second = tracker.plan(_req(history), renderer)
    assert first.continuity is ContinuityClass.FIRST
    assert second.continuity is ContinuityClass.EXACT and not second.rendered
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(gen.token_ids)]
        == first.prompt_ids + gen.token_ids
    )
    # The new part is the template's rendering of the tool result and the generation prompt.
    suffix = renderer.decode(second.prompt_ids[len(first.prompt_ids) + len(gen.token_ids) :])
    assert (
        suffix == "\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_retries_and_mismatches_are_classified(renderer: Renderer) -> None:
    tracker = ContinuityTracker("r")
    _, gen = _answer(
        renderer, tracker, _req([SYS, USER]), "e0", CompletionStatus.CLIENT_DISCONNECTED
    )
    retry = tracker.plan(_req([SYS, USER]), renderer)
    assert retry.continuity is ContinuityClass.RETRY and retry.retry_of == "e0"
    tracker.commit(retry, "e1", _req([SYS, USER]), gen, CompletionStatus.OK)

    assistant = gen.assistant_message()
    tool = {"role": "tool", "tool_call_id": "call_e0", "content": "a.txt"}
    rewritten = {
        **assistant,
        "tool_calls": [
            {
                **assistant["tool_calls"][0],
                "function": {"name": "shell", "arguments": '{"cmd":"ls"}'},
            }
        ],
    }  # re-serialised arguments
    cases = {
        ContinuityClass.REWRITTEN: [SYS, USER, rewritten, tool],
        ContinuityClass.INJECTED: [
            SYS,
            USER,
            {"role": "user", "content": "reminder"},
            assistant,
            tool,
        ],
        ContinuityClass.DROPPED: [SYS, USER, tool],
        ContinuityClass.COMPACTED: [SYS, {"role": "user", "content": "summary of the work so far"}],
    }
    for expected, history in cases.items():
        plan = tracker.plan(_req(history), renderer)
        assert plan.continuity is expected, (expected, plan.continuity)
        assert plan.rendered and plan.prompt_ids == renderer.encode(
            renderer.render(history, TOOLS, True)
        )


def test_sub_agents_and_side_calls_get_threads_of_their_own(renderer: Renderer) -> None:
    tracker = ContinuityTracker("r")
    main, _ = _answer(renderer, tracker, _req([SYS, USER]), "e0")
    explorer = {"role": "system", "content": "You explore repositories."}
    sub = tracker.plan(_req([explorer, {"role": "user", "content": "explore the repo"}]), renderer)
    assert sub.thread is not main.thread and sub.continuity is ContinuityClass.FIRST
    assert sub.parent_event_id == "e0" and not sub.thread.side_call
    title = tracker.plan(
        _req([{"role": "user", "content": "title this"}], model="small", tools=[]), renderer
    )
    assert title.thread.side_call and title.parent_event_id is None


def test_failed_turn_with_rewritten_prompt_before_trailing_context_is_a_retry(
    renderer: Renderer,
) -> None:
    """OpenClaw's retry: the prompt is rewritten, its trailing context message stays the same."""
    context = {"role": "user", "content": "[internal context] cwd=/work"}
    tracker = ContinuityTracker("r")
    failed, _ = _answer(
        renderer, tracker, _req([SYS, USER, context]), "e0", CompletionStatus.UPSTREAM_ERROR
    )
    rewritten = {"role": "user", "content": "[Queued] fix the bug\n\nContinue the task."}
    retry = tracker.plan(_req([SYS, rewritten, context]), renderer)
    assert retry.continuity is ContinuityClass.RETRY and retry.retry_of == "e0"
    assert retry.thread is failed.thread

    # The same shape after a successful call is a new thread, not a retry.
    tracker = ContinuityTracker("r")
    _answer(renderer, tracker, _req([SYS, USER, context]), "e0")
    other = tracker.plan(_req([SYS, rewritten, context]), renderer)
    assert other.continuity is not ContinuityClass.RETRY and other.retry_of is None


IMAGE = {"type": "image", "media_type": "image/png", "data": "AA==", "sha256": "0" * 64}


@settings(max_examples=100)
@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=6),
    st.lists(st.integers(0, 50), max_size=4),
    st.lists(st.integers(0, 50), max_size=4),
    st.booleans(),
)
def test_an_engine_rendered_call_is_exact_only_if_its_ids_extend_the_thread(
    renderer: Renderer, first: list[int], completion: list[int], new: list[int], drift: bool
) -> None:
    """A call with an image: planned from its messages (no ids yet, nothing rendered here);
    the engine's prompt ids decide EXACT (they extend the previous prompt and completion) or
    REWRITTEN (the engine tokenized the history otherwise)."""
    tracker = ContinuityTracker("r")
    user = {"role": "user", "content": [{"type": "text", "text": "the page:"}, IMAGE]}
    req = _req([SYS, user])
    plan = tracker.plan(req, renderer)
    assert plan.engine and plan.prompt_ids == [] and plan.continuity is ContinuityClass.FIRST
    plan.settle_engine_prompt(first)
    gen = Generation(token_ids=completion or [7], content="ok")
    tracker.commit(plan, "e0", req, gen, CompletionStatus.OK)
    history = [SYS, user, gen.assistant_message(), {"role": "user", "content": [IMAGE]}]
    second = tracker.plan(_req(history), renderer)
    assert second.engine and second.continuity is ContinuityClass.EXACT
    engine_ids = [*first, *gen.token_ids, *new]
    if drift:
        engine_ids[len(first) + len(gen.token_ids) - 1] += 1  # a generated token re-tokenized
    second.settle_engine_prompt(engine_ids)
    assert second.prompt_ids == engine_ids
    expected = ContinuityClass.REWRITTEN if drift else ContinuityClass.EXACT
    assert second.continuity is expected
