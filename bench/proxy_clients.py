"""Closed-loop clients for the proxy benchmark: each plays its conversations against a target
(a URL and headers), sending a thread's next turn when the answer to the last one is in, and
records first- and last-byte latency per call (:class:`~bench.proxy_report.Phase`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from bench.proxy_report import Phase
from bench.proxy_threads import Conversation, answer_text
from schemas.enums import Dialect


@dataclass
class Target:
    """Where one thread's calls go: a URL and its headers."""

    url: str
    headers: dict[str, str]
    rollout_id: str | None = None


async def play(
    session: aiohttp.ClientSession,
    target: Target,
    conv: Conversation,
    dialect: Dialect,
    turns: int,
    out: Phase,
) -> None:
    name = target.rollout_id or f"direct-{conv.seed}"
    for turn in range(turns):
        conv.next_user()
        payload = json.dumps(conv.body(dialect)).encode()
        t0 = time.perf_counter()
        first = 0.0
        chunks = []
        async with session.post(target.url, data=payload, headers=target.headers) as resp:
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter() - t0
                chunks.append(chunk)
            total = time.perf_counter() - t0
            if resp.status != 200:
                raise RuntimeError(
                    f"{target.url} answered {resp.status}: {b''.join(chunks)[:500]!r}"
                )
        conv.record_answer(answer_text(dialect, b"".join(chunks)))
        out.calls.append((name, turn, first, total))


async def phase(
    targets: list[list[Target]], convs: list[list[Conversation]], dialect: Dialect, turns: int
) -> Phase:
    out = Phase()
    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=len(targets) + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(ts: list[Target], cs: list[Conversation]) -> None:
            for t, c in zip(ts, cs, strict=True):
                await play(session, t, c, dialect, turns, out)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(t, c) for t, c in zip(targets, convs, strict=True)))
        out.wall = time.perf_counter() - t0
    return out
