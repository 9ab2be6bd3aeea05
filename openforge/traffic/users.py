"""One simulated user's session: a multi-turn conversation through the proxy in one dialect,
then (for some sessions, later) a person's feedback on it.

The user asks the model to say a word and, on the next turns, asks again; the feedback is 1.0 when
the model's last reply holds the word, 0.5 when it is at most :data:`SHORT_WORDS` words (brief, if
not right: a tiny untrained model seldom says the word, and the trainer still gets a signal that
depends on what it wrote), else 0.0; posted with the feedback credential to ``POST
/sessions/ID/reward``, or, for the sessions planned so, to ``POST /responses/ID/reward`` with the
id of the last answer (as a person rating one answer does). A call the proxy cannot answer now
(connection refused or reset: a proxy restarting; 429 or 503: paused or behind) is retried with
backoff for up to ``retry_s``, as a harness does; the result counts what was answered, retried
and given up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from openforge.traffic.dialects import PATHS, Dialect, headers, reply_text, request

RETRIED_STATUS = frozenset({429, 502, 503, 504})
SHORT_WORDS = 3


@dataclass(frozen=True)
class SessionPlan:
    """What one session does: its identity, dialect, word and turns, and when (seconds after
    its last answer) its feedback comes; None: never. ``by_response``: the feedback names the
    last answer's response id, not the session."""

    session: str
    dialect: Dialect
    word: str
    turns: int
    feedback_after_s: float | None
    by_response: bool = False
    harness: str | None = None  # a real harness plays it (openforge.traffic.harness_users)


@dataclass
class SessionResult:
    plan: SessionPlan
    answered: int = 0  # calls answered 200
    failed: int = 0  # calls given up after retries (the session ends there)
    retries: int = 0  # attempts retried
    last_reply: str = ""
    last_response_id: str = ""  # the id of its last answer (chatcmpl-..., resp_..., msg_...)
    ended_at: float = 0.0  # monotonic time of its last answer
    feedback: float | None = None  # the value posted, once posted
    feedback_at: float | None = None  # when it was posted (Unix seconds)
    feedback_error: str | None = None  # why posting it failed
    feedback_retries: int = 0  # posts retried (the proxy restarting, paused or behind)
    errors: list[str] = field(default_factory=list)
    verdict: float | None = None  # a harness session: the verdict on what it left

    def judged(self) -> float:
        """The simulated person's verdict (see the module docstring)."""
        if self.verdict is not None:
            return self.verdict
        if self.plan.word in self.last_reply.lower():
            return 1.0
        return 0.5 if len(self.last_reply.split()) <= SHORT_WORDS else 0.0


def prompt(word: str, turn: int) -> str:
    if turn == 0:
        return f"Say the word {word}."
    return f"Again, only the word {word}, please."


class ProxyClient:
    """The simulated users' HTTP client: calls with retries, and feedback."""

    def __init__(
        self,
        base_url: str,
        feedback_token: str | None,
        retry_s: float = 60.0,
        timeout: float = 600.0,  # the OpenAI SDK's: a call held through a weight swap is waited for
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.feedback_token = feedback_token
        self.retry_s = retry_s
        self.http = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=256))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(
        self, dialect: Dialect, session: str, body: dict[str, Any], result: SessionResult
    ) -> dict[str, Any] | None:
        """The 200 answer's JSON, or None (the error kept in ``result.errors``)."""
        deadline, backoff = time.monotonic() + self.retry_s, 0.2
        while True:
            why = await self._attempt(dialect, session, body)
            if isinstance(why, dict):
                return why
            if why[1] is False or time.monotonic() + backoff > deadline:
                result.errors.append(why[0])
                return None
            result.retries += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _attempt(
        self, dialect: Dialect, session: str, body: dict[str, Any]
    ) -> dict[str, Any] | tuple[str, bool]:
        """The answer, or (why it failed, whether to retry)."""
        started = time.monotonic()
        try:
            resp = await self.http.post(
                self.base_url + PATHS[dialect], json=body, headers=headers(dialect, session)
            )
        except httpx.TransportError as exc:  # refused, reset: the proxy is restarting
            took = time.monotonic() - started
            return f"{type(exc).__name__} after {took:.1f} s: {exc}", True
        if resp.status_code == 200:
            answer: dict[str, Any] = resp.json()
            return answer
        return f"{resp.status_code}: {resp.text[:200]}", resp.status_code in RETRIED_STATUS

    async def feedback(self, value: float, result: SessionResult) -> str | None:
        """Post ``value`` as the session's feedback, by session or by its last response id; None,
        or why it failed (each retry counted in ``result``). Where the proxy no longer remembers
        the session (it restarted), post to its first rollout by id."""
        auth = {"authorization": f"Bearer {self.feedback_token}"} if self.feedback_token else {}
        body = {"reward": value, "verifier": "feedback"}
        deadline = time.monotonic() + self.retry_s
        session = result.plan.session
        urls = [f"/sessions/{session}/reward", f"/rollout/session-{session}/reward"]
        if result.plan.by_response:
            urls = [f"/responses/{result.last_response_id}/reward"]
        while True:
            try:
                resp = await self.http.post(self.base_url + urls[0], json=body, headers=auth)
            except httpx.TransportError as exc:
                resp, why = None, f"{type(exc).__name__}: {exc}"
            if resp is not None and resp.status_code == 404 and len(urls) > 1:
                urls.pop(0)
                continue
            if resp is not None and resp.status_code == 201:
                return None
            if resp is not None:
                why = f"{resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in RETRIED_STATUS:
                    return why
            if time.monotonic() > deadline:
                return why
            result.feedback_retries += 1
            await asyncio.sleep(0.5)


async def play(client: ProxyClient, plan: SessionPlan, max_tokens: int) -> SessionResult:
    """Play ``plan``'s turns; the session ends at its last answer or its first failed call."""
    result = SessionResult(plan)
    turns: list[tuple[str, str]] = []
    for turn in range(plan.turns):
        turns.append(("user", prompt(plan.word, turn)))
        answer = await client.call(
            plan.dialect, plan.session, request(plan.dialect, turns, max_tokens), result
        )
        if answer is None:
            result.failed += 1
            break
        result.answered += 1
        result.last_reply = reply_text(plan.dialect, answer)
        result.last_response_id = str(answer.get("id", ""))
        result.ended_at = time.monotonic()
        turns.append(("assistant", result.last_reply))
    return result


async def give_feedback(client: ProxyClient, result: SessionResult) -> None:
    """The person's feedback, ``plan.feedback_after_s`` after the session's last answer."""
    after = result.plan.feedback_after_s
    if after is None or (result.answered == 0 and result.verdict is None):
        return
    await asyncio.sleep(max(0.0, result.ended_at + after - time.monotonic()))
    value = result.judged()
    result.feedback_error = await client.feedback(value, result)
    if result.feedback_error is None:
        result.feedback, result.feedback_at = value, time.time()
