"""N concurrent simulated users against a proxy in open mode (:mod:`openforge.traffic.users`).

Each user plays sessions one after another, cycling through the three dialects and the real
harnesses asked for (``harnesses``: Codex CLI, Claude Code, :mod:`openforge.traffic.harness_users`);
a fraction of
the sessions gets feedback, each after a delay drawn from ``feedback_delay_s`` (late: after the
proxy ended the idle session), and the rest never. The run ends after ``sessions`` sessions, or
earlier when ``keep_going`` says so; every feedback still due is then posted before it returns.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openforge.traffic.dialects import Dialect
from openforge.traffic.harness_users import harness_dialect, play_harness
from openforge.traffic.users import ProxyClient, SessionPlan, SessionResult, give_feedback, play
from schemas.errors import ConfigError

# One-token words of the tiny model's vocabulary (as the demo's tasks use).
WORDS = ("red", "blue", "green", "one", "two", "three", "cat", "dog", "sun", "tree", "book", "car")


@dataclass(frozen=True)
class TrafficConfig:
    """users: concurrent users; sessions: sessions in all (None: until ``keep_going`` is false);
    turns: calls per session; feedback_fraction: the share of sessions that get feedback;
    feedback_delay_s: (low, high) seconds after a session's last answer; think_s: a user's pause
    between sessions; tag: prefix of the session ids (default: random, so runs never collide);
    harnesses: real harnesses that play sessions too, in turn with the dialects (their homes
    and workspaces under ``harness_root``, default a temporary directory), each run at most
    ``harness_timeout_s``."""

    proxy_url: str
    users: int = 4
    sessions: int | None = 12
    turns: int = 2
    feedback_fraction: float = 0.75
    feedback_delay_s: tuple[float, float] = (0.0, 5.0)
    think_s: float = 0.0
    max_tokens: int = 16
    seed: int = 0
    feedback_token: str | None = None
    retry_s: float = 60.0
    dialects: tuple[Dialect, ...] = tuple(Dialect)
    harnesses: tuple[str, ...] = ()
    harness_root: Path | None = None
    harness_timeout_s: float = 180.0
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self) -> None:
        if self.users < 1 or (self.sessions is not None and self.sessions < 0) or self.turns < 1:
            raise ConfigError("traffic: users and turns must be >= 1, sessions >= 0")
        if not 0.0 <= self.feedback_fraction <= 1.0:
            raise ConfigError(f"feedback_fraction must be in [0, 1], not {self.feedback_fraction}")
        low, high = self.feedback_delay_s
        if not 0.0 <= low <= high:
            raise ConfigError("feedback_delay_s must be (low, high) with 0 <= low <= high")
        if not self.dialects and not self.harnesses:
            raise ConfigError("traffic: name at least one dialect or harness")
        for name in self.harnesses:
            harness_dialect(name)  # one that cannot be a user fails here


@dataclass
class TrafficReport:
    results: list[SessionResult]

    @property
    def answered(self) -> int:
        return sum(r.answered for r in self.results)

    def counts(self) -> dict[str, int]:
        """What the run did, by name (the soak benchmark's and the CLI's figures)."""
        rs = self.results
        return {
            "sessions": len(rs),
            "calls_answered": self.answered,
            "calls_failed": sum(r.failed for r in rs),
            "calls_retried": sum(r.retries for r in rs),
            "feedback_posted": sum(r.feedback is not None for r in rs),
            "feedback_retried": sum(r.feedback_retries for r in rs),
            "feedback_by_response": sum(r.feedback is not None and r.plan.by_response for r in rs),
            "feedback_failed": sum(r.feedback_error is not None for r in rs),
            "feedback_never": sum(r.plan.feedback_after_s is None for r in rs),
            "harness_sessions": sum(r.plan.harness is not None for r in rs),
            "harness_sessions_failed": sum(r.plan.harness is not None and r.failed > 0 for r in rs),
        }

    def failures(self) -> list[str]:
        """Why each failed call and feedback failed, one line each (the session first)."""
        lines = [f"{r.plan.session}: call failed: {e}" for r in self.results for e in r.errors]
        lines += [
            f"{r.plan.session}: feedback failed: {r.feedback_error}"
            for r in self.results
            if r.feedback_error is not None
        ]
        return lines


def plans(cfg: TrafficConfig) -> Iterator[SessionPlan]:
    """The sessions to play, in order (deterministic in ``seed``)."""
    rng = random.Random(cfg.seed)
    players: list[Dialect | str] = [*cfg.dialects, *cfg.harnesses]
    n = 0
    while cfg.sessions is None or n < cfg.sessions:
        feedback = rng.random() < cfg.feedback_fraction
        player = players[n % len(players)]
        harness = None if isinstance(player, Dialect) else player
        yield SessionPlan(
            session=f"sim-{cfg.tag}-{n:05d}",  # a harness names its own: the result says which
            dialect=harness_dialect(harness) if harness else Dialect(player),
            word=rng.choice(WORDS),
            turns=cfg.turns,
            feedback_after_s=rng.uniform(*cfg.feedback_delay_s) if feedback else None,
            # a quarter rate one answer by its id (every dialect in turn); a harness's answers
            # are its own: feedback finds its session by the id it reports
            by_response=n % 4 == 3 and harness is None,
            harness=harness,
        )
        n += 1


async def simulate(
    cfg: TrafficConfig, keep_going: Callable[[], bool] = lambda: True
) -> TrafficReport:
    """Run the users (see the module docstring)."""
    client = ProxyClient(cfg.proxy_url, cfg.feedback_token, cfg.retry_s)
    todo, results = plans(cfg), []
    feedback: list[asyncio.Task[None]] = []
    root = cfg.harness_root or Path(tempfile.mkdtemp(prefix="openforge-users-"))

    async def session(plan: SessionPlan) -> SessionResult:
        if plan.harness is None:
            return await play(client, plan, cfg.max_tokens)
        return await play_harness(cfg.proxy_url, plan, root, cfg.harness_timeout_s)

    async def user() -> None:
        for plan in todo:  # one iterator shared by the users: each plan is played once
            result = await session(plan)
            results.append(result)
            feedback.append(asyncio.create_task(give_feedback(client, result)))
            if not keep_going():
                return
            await asyncio.sleep(cfg.think_s)

    try:
        await asyncio.gather(*(user() for _ in range(cfg.users)))
        await asyncio.gather(*feedback)
    finally:
        await client.aclose()
    return TrafficReport(results)


def run(cfg: TrafficConfig, keep_going: Callable[[], bool] = lambda: True) -> TrafficReport:
    return asyncio.run(simulate(cfg, keep_going))
