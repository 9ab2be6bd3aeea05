"""Simulated users that are real harnesses: Codex CLI or Claude Code, run unmodified, pointed at
the proxy's plain routes (open mode), one session per run.

Nobody registers anything: the harness names its session in its own header (Codex's
``session-id``, Claude Code's ``x-claude-code-session-id``), the proxy records the session's
calls into ``session-<that id>``, and the harness reports the same id in its output, which is
how the simulated person's feedback finds the session later (``POST /sessions/ID/reward``). The
task asks for a file; the verdict is 1.0 if the harness left it with the word in it, 0.5 if the
harness ended cleanly, else 0.0 (what a CI check on the user's machine would say). OpenClaw is
not offered: it names its calls by a ``traceparent`` trace id it does not report, so no feedback
could find its session.

How many calls a harness made is its own business: a harness session counts no calls answered
(``SessionResult.answered``); its calls are in the log under its rollout.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from infra.harnesses import harness
from infra.harnesses.base import Endpoint, RolloutDirs
from infra.harnesses.runner import run_invocation
from openforge.traffic.dialects import Dialect
from openforge.traffic.users import SessionPlan, SessionResult
from schemas.errors import ConfigError
from schemas.registry import one_of

HARNESS_USERS = ("codex", "claude-code")  # each reports the session id its header carries


def harness_dialect(name: str) -> Dialect:
    """The dialect harness ``name`` speaks; a ConfigError for one that cannot be a user."""
    if name not in HARNESS_USERS:
        raise ConfigError(
            f"harness {name!r} cannot be a simulated user: choose {one_of(HARNESS_USERS)} "
            "(a user's feedback needs the session id the harness "
            "reports; OpenClaw names its calls by a trace id it does not report)"
        )
    speaks = harness(name).dialect
    assert speaks is not None  # both call a model
    return Dialect(speaks.value)


def task(word: str) -> str:
    return f"Create a file named {word}.txt that contains the word {word}, then stop."


async def play_harness(
    proxy_url: str, plan: SessionPlan, root: Path, timeout_s: float
) -> SessionResult:
    """Run ``plan.harness`` on one session (in a thread: it is a process)."""
    return await asyncio.to_thread(_run, proxy_url, plan, root, timeout_s)


def _run(proxy_url: str, plan: SessionPlan, root: Path, timeout_s: float) -> SessionResult:
    assert plan.harness is not None
    program = harness(plan.harness)
    dirs = RolloutDirs.under(root / plan.session)
    endpoint = Endpoint(proxy_url, plan.session, "sim-user", model="policy", open_mode=True)
    inv = program.invocation(task(plan.word), endpoint, dirs, timeout_s)
    out, err = dirs.home / "stdout.txt", dirs.home / "stderr.txt"
    code, _ = run_invocation(inv, f"sim-{plan.session}", out, err, timeout_s)
    report = program.report(out.read_text(errors="replace"))
    session = report.session_id
    result = SessionResult(plan if session is None else replace(plan, session=session))
    result.ended_at = time.monotonic()
    result.last_reply = report.final_message or ""
    if session is None:
        result.failed = 1
        tail = err.read_text(errors="replace")[-300:]
        result.errors.append(f"{program.name} exited {code} reporting no session: {tail}")
        return result
    made = dirs.workspace / f"{plan.word}.txt"
    done = made.is_file() and plan.word in made.read_text(errors="replace").lower()
    result.verdict = 1.0 if done else 0.5 if code == 0 else 0.0
    return result
