"""The simulator's plans and its reading of each dialect's answer (the services-apart test runs
it against the real services: tests/openforge/serve/test_apart.py)."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openforge.traffic.dialects import Dialect, ReplyError, headers, reply_text, request
from openforge.traffic.simulate import TrafficConfig, plans
from openforge.traffic.users import SessionPlan, SessionResult
from schemas.errors import ConfigError


@given(
    seed=st.integers(0, 2**32),
    fraction=st.floats(0, 1),
    low=st.floats(0, 5),
    span=st.floats(0, 5),
)
def test_plans_are_deterministic_cycle_the_dialects_and_keep_the_delays(
    seed: int, fraction: float, low: float, span: float
) -> None:
    cfg = TrafficConfig("http://p", sessions=30, seed=seed, feedback_fraction=fraction,
                        feedback_delay_s=(low, low + span), tag="t")  # fmt: skip
    first, again = list(plans(cfg)), list(plans(cfg))
    assert first == again and len(first) == 30
    assert [p.dialect for p in first[:3]] == list(Dialect)
    assert len({p.session for p in first}) == 30
    delays = [p.feedback_after_s for p in first if p.feedback_after_s is not None]
    assert all(low <= d <= low + span for d in delays)
    if fraction == 0:
        assert not delays
    if fraction == 1:
        assert len(delays) == 30


def test_endless_plans_and_bad_configs() -> None:
    assert len(list(islice(plans(TrafficConfig("http://p", sessions=None)), 1000))) == 1000
    for bad in ({"users": 0}, {"feedback_fraction": 1.5}, {"feedback_delay_s": (3.0, 1.0)},
                {"dialects": ()}, {"turns": 0}):  # fmt: skip
        with pytest.raises(ConfigError):
            TrafficConfig("http://p", **bad)


ANSWERS: dict[Dialect, dict[str, Any]] = {
    Dialect.CHAT: {"choices": [{"message": {"role": "assistant", "content": "red"}}]},
    Dialect.RESPONSES: {
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "red"}]},
        ]
    },
    Dialect.MESSAGES: {"content": [{"type": "text", "text": "red"}]},
}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_each_dialect_sends_the_history_with_its_session_header_and_reads_the_reply(
    dialect: Dialect,
) -> None:
    body = request(dialect, [("user", "a"), ("assistant", "b"), ("user", "c")], 8)
    history = body["messages"] if "messages" in body else body["input"]
    assert [m["content"] for m in history] == ["a", "b", "c"]
    assert any(k in body for k in ("max_tokens", "max_output_tokens"))
    assert dialect.value and headers(dialect, "s1")  # a session header, whatever its name
    assert "s1" in headers(dialect, "s1").values()
    assert reply_text(dialect, ANSWERS[dialect]) == "red"
    with pytest.raises(ReplyError, match="reply text"):
        reply_text(dialect, {"error": "nope"})


def test_the_simulated_verdict() -> None:
    plan = SessionPlan("s", Dialect.CHAT, "red", 2, 1.0)
    assert SessionResult(plan, last_reply="Red? red.").judged() == 1.0
    assert SessionResult(plan, last_reply="blue sky").judged() == 0.5
    assert SessionResult(plan, last_reply="a long answer that never says it").judged() == 0.0
