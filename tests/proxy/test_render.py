"""Incremental rendering: a continuation's new messages rendered from a window of the
conversation give exactly the ids a full rendering gives, for randomized multi-turn threads in
each dialect (as harnesses resend them) with the tiny model's real chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.canonical import CallRequest, Generation, ToolCall
from proxy.continuity import ContinuityTracker
from proxy.dialects.base import ResponseMeta
from proxy.dialects.registry import DIALECTS
from proxy.render import Renderer, RenderMode
from schemas.enums import CompletionStatus, ContinuityClass, Dialect

WORDS = st.text(alphabet="abcdefghij klmn\n{}\"'<>", min_size=0, max_size=40)


@pytest.fixture(scope="module")
def renderers(tiny_model_dir: Path) -> tuple[Renderer, Renderer]:
    full = Renderer(tiny_model_dir, RenderMode.FULL)
    windowed = Renderer(tiny_model_dir, RenderMode.AUTO, verify_first=0)  # windows, unchecked
    return full, windowed


# One turn of the model and what the harness appends after it: tool calls are answered by one
# result each (consecutive tool messages), followed sometimes by a user message.
TURN = st.tuples(
    WORDS,  # the model's text
    st.integers(0, 3),  # how many tool calls it makes
    st.lists(WORDS, min_size=3, max_size=3),  # the tool results
    st.one_of(st.none(), WORDS),  # a user message after them
)
THREAD = st.tuples(
    st.one_of(st.none(), WORDS),  # a system prompt
    st.integers(0, 3),  # tools offered
    WORDS,  # the first user message
    st.lists(TURN, min_size=1, max_size=6),
)


def _tools(dialect: Dialect, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        name, desc, params = f"tool{i}", f"does {i}", {"type": "object", "properties": {}}
        if dialect is Dialect.CHAT:
            fn = {"name": name, "description": desc, "parameters": params}
            out.append({"type": "function", "function": fn})
        elif dialect is Dialect.RESPONSES:
            out.append(
                {"type": "function", "name": name, "description": desc, "parameters": params}
            )
        else:
            out.append({"name": name, "description": desc, "input_schema": params})
    return out


def _body(dialect: Dialect, system: str | None, tools: list[Any], history: list[Any]) -> Any:
    body: dict[str, Any] = {"model": "main", "max_tokens": 16, "tools": tools}
    if dialect is Dialect.RESPONSES:
        body = {"model": "main", "max_output_tokens": 16, "tools": tools, "input": history}
        if system:
            body["instructions"] = system
        return body
    if dialect is Dialect.MESSAGES:
        if system:
            body["system"] = system
        return {**body, "messages": history}
    sys_msgs = [{"role": "system", "content": system}] if system else []
    return {**body, "messages": [*sys_msgs, *history]}


def _user(dialect: Dialect, text: str) -> dict[str, Any]:
    return {"role": "user", "content": text or "."}


def _results(dialect: Dialect, calls: list[ToolCall], texts: list[str]) -> list[dict[str, Any]]:
    pairs = list(zip(calls, texts, strict=False))
    if dialect is Dialect.CHAT:
        return [{"role": "tool", "tool_call_id": c.id, "content": t} for c, t in pairs]
    if dialect is Dialect.RESPONSES:
        return [{"type": "function_call_output", "call_id": c.id, "output": t} for c, t in pairs]
    blocks = [{"type": "tool_result", "tool_use_id": c.id, "content": t or "."} for c, t in pairs]
    return [{"role": "user", "content": blocks}]


def _answer_items(dialect: Dialect, answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's answer as the harness puts it into the next request's history."""
    if dialect is Dialect.CHAT:
        return [answer["choices"][0]["message"]]
    if dialect is Dialect.RESPONSES:
        return list(answer["output"])
    return [{"role": "assistant", "content": answer["content"]}]


def _generation(renderer: Renderer, text: str, calls: list[ToolCall]) -> Generation:
    parts = [text] + [
        f'<tool_call>\n{{"name": "{c.name}", "arguments": {c.arguments}}}\n</tool_call>'
        for c in calls
    ]
    ids = [*renderer.encode("\n".join(p for p in parts if p)), renderer.eos_token_id or 0]
    return Generation(token_ids=ids, content=text, tool_calls=calls, finish_reason="stop")


def _play(
    dialect: Dialect, thread: Any, renderer: Renderer, tracker: ContinuityTracker
) -> list[tuple[ContinuityClass, list[int]]]:
    """The plans of one thread's calls, as the harness resends the history each turn."""
    system, n_tools, first, turns = thread
    impl = DIALECTS.get(dialect)
    tools = _tools(dialect, n_tools)
    history: list[Any] = [_user(dialect, first)]
    plans = []
    for i, (text, n_calls, results, user) in enumerate(turns):
        req: CallRequest = impl.parse(_body(dialect, system, tools, history))
        plan = tracker.plan(req, renderer)
        plans.append((plan.continuity, plan.prompt_ids))
        names = [f"tool{k % max(1, n_tools)}" for k in range(n_calls)]
        calls = [ToolCall(f"call_{i}_{k}", n, json.dumps({"k": k})) for k, n in enumerate(names)]
        gen = _generation(renderer, text, calls)
        tracker.commit(plan, f"e{i}", req, gen, CompletionStatus.OK)
        history += _answer_items(dialect, impl.respond(gen, req, ResponseMeta("x", "main")))
        history += _results(dialect, calls, results)
        if user is not None or not calls:
            history.append(_user(dialect, user or "go on"))
    return plans


@pytest.mark.parametrize("dialect", list(Dialect))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(thread=THREAD)
def test_windowed_continuations_equal_full_renderings(
    renderers: tuple[Renderer, Renderer], dialect: Dialect, thread: Any
) -> None:
    full, windowed = renderers
    before = windowed.stats.windowed, windowed.stats.stubbed
    expected = _play(dialect, thread, full, ContinuityTracker("r"))
    got = _play(dialect, thread, windowed, ContinuityTracker("r"))
    assert got == expected
    assert windowed.stats.window_mismatches == windowed.stats.stub_mismatches == 0
    exact = sum(c is ContinuityClass.EXACT for c, _ in expected)
    windows = windowed.stats.windowed - before[0]
    stubbed = windowed.stats.stubbed - before[1]
    if thread[0] or thread[1]:
        # With a system prompt or tools, every exact continuation came from a window with a
        # stand-in head (also the first, whose window is the whole conversation).
        assert (stubbed, windows) == (exact, 0)
    else:
        # Without, every one past the first (no turn before it to leave out) from a window.
        assert stubbed == 0 and windows >= max(0, exact - 1)


def _template_variant(tiny_model_dir: Path, tmp: Path, template: str) -> Path:
    out = tmp / "tok"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    (out / "chat_template.jinja").write_text(template)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def test_a_template_that_numbers_turns_turns_windows_off_and_stays_exact(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A template whose rendering of a turn depends on turns before the window is caught by
    the verification of the first calls; from then on continuations are rendered in full."""
    template = (
        (tiny_model_dir / "chat_template.jinja")
        .read_text()
        .replace(
            "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
            "{{- '<|im_start|>' + message.role + '\\n' + loop.index|string + message.content "
            "+ '<|im_end|>\\n' }}",
        )
    )
    assert "loop.index|string" in template
    tok = _template_variant(tiny_model_dir, tmp_path, template)
    thread = (
        "sys",
        1,
        "hi",
        [
            ("a", 0, ["", "", ""], "more"),
            ("b", 0, ["", "", ""], "again"),
            ("c", 0, ["", "", ""], None),
        ],
    )
    auto = Renderer(tok, RenderMode.AUTO)
    expected = _play(Dialect.CHAT, thread, Renderer(tok, RenderMode.FULL), ContinuityTracker("r"))
    assert _play(Dialect.CHAT, thread, auto, ContinuityTracker("r")) == expected
    assert auto.stats.window_mismatches == 1 and auto.stats.windowed == 0
    assert [c for c, _ in expected] == [ContinuityClass.FIRST, *[ContinuityClass.EXACT] * 2]


def test_a_template_that_reads_the_system_prompt_in_later_turns_keeps_the_real_head(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A template whose later turns depend on the system prompt is caught by the verification of
    the stand-in head; the window goes on with the real head, and the ids stay exact."""
    template = (
        (tiny_model_dir / "chat_template.jinja")
        .read_text()
        .replace(
            "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
            "{{- '<|im_start|>' + message.role + '\\n' + messages[0].content|length|string "
            "+ message.content + '<|im_end|>\\n' }}",
        )
    )
    assert "messages[0].content|length" in template
    tok = _template_variant(tiny_model_dir, tmp_path, template)
    turns = [(t, 0, ["", "", ""], f"more {t}") for t in "abcd"]
    thread = ("a long system prompt", 1, "hi", turns)
    auto = Renderer(tok, RenderMode.AUTO, verify_first=2)
    expected = _play(Dialect.CHAT, thread, Renderer(tok, RenderMode.FULL), ContinuityTracker("r"))
    assert _play(Dialect.CHAT, thread, auto, ContinuityTracker("r")) == expected
    assert [c for c, _ in expected] == [ContinuityClass.FIRST, *[ContinuityClass.EXACT] * 3]
    assert (auto.stats.stub_mismatches, auto.stats.window_mismatches) == (1, 0)
    assert (auto.stats.stubbed, auto.stats.windowed) == (0, 1)  # the third call, past the checks


def test_first_calls_reuse_the_shared_system_prompt_ids(tiny_model_dir: Path) -> None:
    renderer = Renderer(tiny_model_dir)
    system = {"role": "system", "content": "You are a coding agent. " * 200}
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    for i in range(3):
        messages = [system, {"role": "user", "content": f"task {i}"}]
        want = renderer.encode(renderer.render(messages, tools, generation=True))
        assert renderer.prompt_ids(messages, tools) == want
    assert (renderer.stats.head_misses, renderer.stats.head_hits) == (1, 2)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.lists(
        st.one_of(WORDS, st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", " é漢"])),
        max_size=8,
    ).map("".join)
)
def test_the_rust_tokenizer_path_gives_the_wrappers_ids_and_text(
    renderers: tuple[Renderer, Renderer], text: str
) -> None:
    renderer = renderers[0]
    tok = renderer._tok
    ids = renderer.encode(text)
    assert ids == list(tok.encode(text, add_special_tokens=False))
    assert renderer.decode(ids) == tok.decode(ids, skip_special_tokens=False)
    assert renderer.decode_text(ids) == tok.decode(ids, skip_special_tokens=True)
