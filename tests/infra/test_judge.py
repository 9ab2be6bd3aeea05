"""The judge's answer parsing and settings (infra.judge); its calls to a real vLLM are tested
with the judge stage (tests/pipeline/test_judge.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.judge import Judge, JudgeConfig, parse_score
from schemas.errors import ConfigError

_NO_DIGITS = st.text(alphabet=st.characters(blacklist_categories=("Nd",)), max_size=40)


@given(st.integers(0, 10), _NO_DIGITS, _NO_DIGITS)
def test_a_score_standing_alone_is_read_whatever_surrounds_it(
    n: int, before: str, after: str
) -> None:
    if after[:1] == ".":  # "7.5": not an integer score
        after = " " + after
    if before[-1:] == ".":  # ".7" neither
        before += " "
    assert parse_score(f"{before}{n}{after}") == n / 10


@given(_NO_DIGITS)
def test_an_answer_without_a_score_has_none(text: str) -> None:
    assert parse_score(text) is None


@pytest.mark.parametrize("text", ["11", "100", "7.5", "-", "1234"])
def test_numbers_out_of_the_scale_are_not_scores(text: str) -> None:
    assert parse_score(text) is None


def test_the_prompt_keeps_the_transcripts_tail_and_says_so() -> None:
    judge = Judge(JudgeConfig("http://127.0.0.1:1/v1/", "m", max_chars=100))
    assert judge.cfg.url == "http://127.0.0.1:1"
    system, user = judge.messages("x" * 500 + "THE END")
    assert "0 to 10" in system["content"] and judge.cfg.rubric in system["content"]
    assert "THE END" in user["content"] and "earlier turns cut" in user["content"]
    assert "cut" not in judge.messages("short")[1]["content"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "127.0.0.1:8000"}, "http"),
        ({"rubric": "  "}, "rubric is empty"),
        ({"tries": 0}, "tries"),
        ({"constraint": "json"}, "unknown constraint"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"url": "http://h:1", "model": "m", **kwargs}
    with pytest.raises(ConfigError, match=message):
        JudgeConfig(**args)  # type: ignore[arg-type]
