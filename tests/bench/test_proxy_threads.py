"""The benchmark's conversations are what the proxy expects of a harness: each dialect's body
parses to the history with the previous answer exactly as the proxy streamed it (so the next
call can be an exact continuation), and the answer's text is read back from each dialect's own
stream events."""

from __future__ import annotations

import pytest

from bench.proxy_threads import Conversation, Prompt, answer_text
from proxy.canonical import Generation
from proxy.dialects.base import ResponseMeta
from proxy.dialects.registry import DIALECTS
from schemas.enums import Dialect


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_thread_resends_the_answer_as_streamed(dialect: Dialect) -> None:
    impl = DIALECTS.get(dialect)
    conv = Conversation(Prompt.sized(300), seed=1, model="m")
    expected = [{"role": "system", "content": conv.prompt.system}]
    for turn in range(3):
        conv.next_user()
        req = impl.parse(conv.body(dialect))
        expected.append(conv.turns[-1])
        assert req.messages == expected
        assert [t["function"]["name"] for t in req.tools] == [
            t["function"]["name"] for t in conv.prompt.tools
        ]
        # The proxy's own stream of an answer, as the harness receives it.
        gen = Generation(token_ids=[5, 6], text=f" tok{turn} é", content=f" tok{turn} é")
        enc = impl.stream(req, ResponseMeta("id-1", "m"), prompt_tokens=10)
        raw = enc.start() + enc.text(" tok") + enc.text(f"{turn} é") + enc.finish(gen)
        conv.record_answer(answer_text(dialect, raw))
        expected.append(gen.assistant_message())
    assert impl.parse(conv.body(dialect)).messages == expected


def test_prompts_grow_with_the_budget() -> None:
    small, large = Prompt.sized(300), Prompt.sized(10_000)
    assert len(large.system) > 20 * len(small.system)
    assert 1 == len(small.tools) < len(large.tools) <= 12
