"""The delta form reconstructs full prompts and request bodies exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import decode_message, encode_message
from schemas.completion import CompletionEvent, Timings
from schemas.delta import HISTORY_KEYS, DeltaEncoder, Reconstructor
from schemas.enums import Dialect
from schemas.errors import SchemaError

TOKENS = st.lists(st.integers(0, 50_000), max_size=20)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=12)}
)


@st.composite
def threads(draw: st.DrawFn) -> list[tuple[list[int], list[int], list[dict[str, Any]]]]:
    """Calls of one thread: (prompt, completion, history). Mostly exact extensions of the
    previous call; sometimes a rewritten, dropped or unrelated history."""
    calls: list[tuple[list[int], list[int], list[dict[str, Any]]]] = []
    for _ in range(draw(st.integers(1, 12))):
        new_tokens, completion = draw(TOKENS), draw(TOKENS)
        new_items = draw(st.lists(MESSAGE, max_size=3))
        if not calls:
            prompt, history = new_tokens, new_items
        else:
            prev_prompt, prev_completion, prev_history = calls[-1]
            base = prev_prompt + prev_completion
            how = draw(st.sampled_from(["exact", "exact", "exact", "cut", "unrelated"]))
            if how == "exact":
                prompt, history = base + new_tokens, prev_history + new_items
            elif how == "cut":
                k = draw(st.integers(0, len(base)))
                j = draw(st.integers(0, len(prev_history)))
                prompt, history = base[:k] + new_tokens, prev_history[:j] + new_items
            else:
                prompt, history = new_tokens, new_items
        calls.append((prompt, completion, history))
    return calls


@settings(max_examples=150, deadline=None)
@given(calls=threads(), dialect=st.sampled_from(Dialect))
def test_random_threads_reconstruct_exactly(
    calls: list[tuple[list[int], list[int], list[dict[str, Any]]]], dialect: Dialect
) -> None:
    encoder = DeltaEncoder()
    events = []
    for i, (prompt, completion, history) in enumerate(calls):
        body = {"model": "m", HISTORY_KEYS[dialect]: history, "stream": True}
        pdelta, hdelta = encoder.encode("thread", f"e{i}", dialect, prompt, completion, body)
        assert hdelta is not None
        event = CompletionEvent(
            event_id=f"e{i}",
            rollout_id="r",
            call_index=i,
            dialect=dialect,
            streamed=True,
            model="m",
            timings=Timings(received_us=i),
            prompt_ref_event_id=pdelta.ref_event_id,
            prompt_ref_tokens=pdelta.ref_tokens,
            prompt_token_ids=pdelta.suffix,
            prompt_length=len(prompt),
            completion_token_ids=completion,
            request_history_ref=hdelta.ref_event_id,
            request_history_prefix=hdelta.prefix,
            request_body=hdelta.body_json,
        )
        events.append(decode_message(encode_message([event], compress=True))[0])

    rebuild = Reconstructor()
    for event, (prompt, _, history) in zip(events, calls, strict=True):
        assert isinstance(event, CompletionEvent)
        full_prompt, full_body = rebuild.add(event)
        assert full_prompt == prompt
        assert full_body == {"model": "m", HISTORY_KEYS[dialect]: history, "stream": True}


def test_exact_extensions_store_each_token_once() -> None:
    encoder = DeltaEncoder()
    prompt: list[int] = []
    stored = unique = 0
    for turn in range(100):
        prompt = [*prompt, turn, turn + 1, turn + 2]  # tool result / user message
        completion = [1000 + turn] * 5
        pdelta, _ = encoder.encode("t", f"e{turn}", Dialect.CHAT, prompt, completion, None)
        stored += len(pdelta.suffix) + len(completion)
        unique += 3 + 5
        prompt = prompt + completion
    assert stored == unique


def test_reconstruction_out_of_order_is_refused() -> None:
    event = CompletionEvent(
        event_id="e1",
        rollout_id="r",
        call_index=1,
        dialect=Dialect.CHAT,
        streamed=False,
        model="m",
        timings=Timings(received_us=0),
        prompt_ref_event_id="e0",
        prompt_ref_tokens=3,
        prompt_token_ids=[9],
        prompt_length=4,
    )
    with pytest.raises(SchemaError, match="call order"):
        Reconstructor().prompt(event)


def test_string_input_is_stored_whole() -> None:
    encoder = DeltaEncoder()
    body = {"model": "m", "input": "just a string"}
    encoder.encode("t", "e0", Dialect.RESPONSES, [1], [2], body)
    _, hdelta = encoder.encode("t", "e1", Dialect.RESPONSES, [1, 2, 3], [4], body)
    assert hdelta is not None and hdelta.ref_event_id is None
    assert json.loads(hdelta.body_json) == body
