"""A model server as a judge: a rubric, a transcript, a score in [0, 1].

    judge = Judge(JudgeConfig("http://127.0.0.1:8000", model="tiny"))
    verdict = judge.score("user: fix the bug\\nassistant: I changed parse() ...")
    verdict.score   # 0.7: the judge answered "7" on the rubric's 0-10 scale

The judge is asked, through the OpenAI Chat Completions API of any compatible server (vLLM,
another upstream), for one integer from 0 to 10 under the rubric; the score is that integer
divided by 10. With ``constraint = vllm`` the answer is constrained to those integers
(vLLM's ``structured_outputs`` choice), so even a small model's answer parses; with ``none``
nothing but the standard API is sent and the first integer 0-10 of the answer is taken.

The judge calls the model server directly, never through the capture proxy: its calls are not
recorded and never become training data. :func:`answer` is the plain call, for whoever needs
a model's reply to a prompt without recording it (a held-out check's candidate policy).

A call that fails is retried (``tries``, backing off); if every try fails, or the answer holds
no score, :class:`JudgeError` says why and what to check.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from schemas.errors import ConfigError, ServiceError
from schemas.registry import choose

DEFAULT_RUBRIC = (
    "Judge how well the assistant did what the user asked in the session below: is the final "
    "result correct and complete, did it follow the instructions, did it avoid needless or "
    "harmful actions. 0 means it failed or did harm, 10 means a flawless result."
)
_SCORES = [str(n) for n in range(11)]
_SCORE = re.compile(r"(?<![\d.])(10|[0-9])(?![\d.])")


class JudgeError(ServiceError):
    """The judge gave no score: its server failed every try, or its answer held none."""


class Constraint(StrEnum):
    """How the judge's answer is held to a score."""

    VLLM = "vllm"  # vLLM's structured_outputs choice of "0".."10"
    NONE = "none"  # the standard API only; the first integer 0-10 of the answer


@dataclass(frozen=True)
class JudgeConfig:
    """url: the model server (``http://HOST:PORT``, its ``/v1`` API); model: the model it
    serves that judges; rubric: what a good session is (the prompt's instructions); max_chars:
    the transcript's tail kept (the end of a session says most about its result); tries: calls
    per score before giving up; api_key: sent as a bearer token, if the server needs one."""

    url: str
    model: str
    rubric: str = DEFAULT_RUBRIC
    constraint: Constraint = Constraint.VLLM
    max_chars: int = 6000
    timeout_s: float = 60.0
    tries: int = 3
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"the judge's url must be http(s)://HOST:PORT, not {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/").removesuffix("/v1"))
        object.__setattr__(self, "constraint", choose(Constraint, self.constraint, "constraint"))
        if not self.rubric.strip():
            raise ConfigError("the judge's rubric is empty: give the criteria of a good session")
        if self.tries < 1 or self.max_chars < 100:
            raise ConfigError("the judge needs tries >= 1 and max_chars >= 100")


@dataclass(frozen=True, slots=True)
class Verdict:
    score: float  # in [0, 1]
    answer: str  # the judge's raw answer
    model: str


def parse_score(answer: str) -> float | None:
    """The first integer 0-10 standing alone in ``answer``, divided by 10 (None if there is
    none)."""
    match = _SCORE.search(answer)
    return int(match.group(1)) / 10 if match else None


def served_model(url: str, timeout_s: float = 10.0) -> str:
    """The first model the OpenAI-compatible server at ``url`` serves (``GET /v1/models``)."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        resp = httpx.get(f"{base}/v1/models", timeout=timeout_s)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise ServiceError(
            f"could not list the models of {base} ({type(exc).__name__}: {exc}): is the model "
            "server up? Or name the model (--judge-model)"
        ) from exc


def answer(
    cfg: JudgeConfig,
    model: str,
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
    extra: dict[str, Any] | None = None,
) -> str:
    """``model``'s reply to ``messages`` on the judge's server, greedy (temperature 0), not
    recorded anywhere; retried ``cfg.tries`` times."""
    body = {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        **(extra or {}),
    }
    headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    why = ""
    for attempt in range(cfg.tries):
        if attempt:
            time.sleep(min(2.0**attempt, 10.0))
        try:
            resp = httpx.post(
                f"{cfg.url}/v1/chat/completions", json=body, headers=headers, timeout=cfg.timeout_s
            )
        except httpx.HTTPError as exc:
            why = f"{type(exc).__name__}: {exc}"
            continue
        if resp.status_code == 200:
            return _content(resp.json())
        why = f"HTTP {resp.status_code}: {resp.text[:300]}"
        if resp.status_code < 500 and resp.status_code != 429:
            break  # the request is wrong: trying again will not help
    raise JudgeError(
        f"the model server at {cfg.url} gave no answer for model {model!r} after {cfg.tries} "
        f"tries ({why}); check that it is up and serves that model"
    )


def _content(payload: dict[str, Any]) -> str:
    try:
        return str(payload["choices"][0]["message"].get("content") or "")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise JudgeError(f"the judge's answer is not a chat completion: {payload!r:.300}") from None


class Judge:
    """Scores transcripts under one :class:`JudgeConfig`."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg

    def messages(self, transcript: str) -> list[dict[str, str]]:
        """The judge's prompt for ``transcript`` (its tail, ``max_chars``)."""
        tail = transcript[-self.cfg.max_chars :]
        cut = "[... earlier turns cut ...]\n" if len(tail) < len(transcript) else ""
        return [
            {
                "role": "system",
                "content": "You are a strict judge of an AI assistant's work. "
                f"{self.cfg.rubric.strip()}\n"
                "Answer with one integer from 0 to 10 and nothing else.",
            },
            {"role": "user", "content": f"The session:\n\n{cut}{tail}\n\nYour score (0-10):"},
        ]

    def score(self, transcript: str) -> Verdict:
        """The judge's score of ``transcript``; :class:`JudgeError` if it gives none."""
        extra = (
            {"structured_outputs": {"choice": _SCORES}}
            if self.cfg.constraint is Constraint.VLLM
            else {}
        )
        text = answer(self.cfg, self.cfg.model, self.messages(transcript), 4, extra)
        value = parse_score(text)
        if value is None:
            raise JudgeError(
                f"the judge ({self.cfg.model}) answered {text[:200]!r}, which holds no score "
                "0-10: use a stronger judge model, or constraint 'vllm' on a vLLM server"
            )
        return Verdict(value, text, self.cfg.model)
