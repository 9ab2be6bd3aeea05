"""Open-mode sessions over a compressed stretch of production traffic: the proxy's memory when
sessions end after an idle time, against the same proxy keeping them open, side by side.

    .venv/bin/python -m bench.session_memory [--sessions 3000] [--turns 3] [--clients 16]

Two ``openforge proxy --open`` processes in front of one vLLM-format upstream
(``openforge.testing.fast_upstream``: the tiny model's tokenizer, 16 tokens an answer), both
with ``--finished-rollouts 500``:

- ``idle-ending``: ``--session-idle 1`` (the code path measured: ``proxy/sessions.py``'s reaper
  ends a session one second after its last call; a day's 30-minute idle time, compressed);
- baseline ``kept open``: ``--session-idle 0`` (sessions end only when finished, as before).

The same traffic goes to both at once: ``--sessions`` sessions, ``--clients`` at a time, each
``--turns`` Chat Completions calls resending its growing history under its own ``session-id``.
Every ``--every`` sessions, each proxy's resident memory (``VmRSS``) and its ``/health`` counts
(live and remembered finished rollouts) are sampled. Proof of path: the idle-ending proxy's
event log holds one ``finished`` rollout event with the message "session idle for 1 s" per
ended session, and its live rollouts stay at those of the last idle second; the baseline's grow
with every session. Reported: the samples, and each proxy's memory growth after the first
``--every`` sessions (the warm-up's allocations).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.proxy_cpu_budget import pid_listening
from bench.proxy_overhead import MODEL, service
from infra.eventlog import EVENTS_TOPIC, open_reader
from infra.local.process import free_port
from infra.paths import default_tiny_dir
from infra.proxy_client import ProxyAdmin
from infra.tiny_model import build_tiny_model
from openforge.stack import proxy_process
from schemas.codec import decode_message
from schemas.enums import RolloutPhase
from schemas.rollout import RolloutEvent

PROXIES = {"idle-ending": "1", "kept open": "0"}  # name -> --session-idle


@dataclass
class Proxy:
    name: str
    admin: ProxyAdmin
    pid: int
    log: Path
    samples: list[tuple[int, float, int, int]] = field(default_factory=list)

    def sample(self, sessions: int) -> None:
        status = Path(f"/proc/{self.pid}/status").read_text()
        rss_kb = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")
        )
        health = httpx.get(f"{self.admin.url}/health", timeout=10).json()
        self.samples.append(
            (sessions, rss_kb / 1024, health["rollouts"], health["finished_rollouts"])
        )


async def session(client: httpx.AsyncClient, url: str, sid: str, turns: int) -> None:
    messages = [{"role": "user", "content": f"session {sid}: list the files"}]
    for _ in range(turns):
        resp = await client.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 16},
            headers={"session-id": sid},
        )
        resp.raise_for_status()
        messages.append(resp.json()["choices"][0]["message"])
        messages.append({"role": "user", "content": "go on"})


async def traffic(proxies: list[Proxy], args: argparse.Namespace) -> None:
    limit = asyncio.Semaphore(args.clients)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            async with limit:
                await asyncio.gather(
                    *(session(client, p.admin.url, f"s{i}", args.turns) for p in proxies)
                )

        for start in range(0, args.sessions, args.every):
            await asyncio.gather(
                *(one(i) for i in range(start, min(start + args.every, args.sessions)))
            )
            for p in proxies:
                p.sample(min(start + args.every, args.sessions))
    await asyncio.sleep(3)  # the last sessions' idle time, and a sweep
    for p in proxies:
        p.sample(args.sessions)


def idle_ends(log: Path) -> int:
    """Rollout events in ``log`` that end a session for idleness."""
    n = 0
    with open_reader(f"local:{log}", [EVENTS_TOPIC], group="bench") as reader:
        while batch := reader.poll(max_records=5000, timeout=1.0):
            for rec in batch:
                for r in decode_message(rec.value):
                    n += (
                        isinstance(r, RolloutEvent)
                        and r.phase is RolloutPhase.FINISHED
                        and (r.message or "").startswith("session idle")
                    )
    return n


@contextlib.contextmanager
def proxies(upstream: str, model_dir: Path, tmp: Path) -> Iterator[list[Proxy]]:
    with contextlib.ExitStack() as stack:
        out = []
        for name, idle in PROXIES.items():
            where = tmp / name.replace(" ", "-")
            extra = ["--open", "--session-idle", idle, "--finished-rollouts", "500",
                     "--max-concurrency", "1024"]  # fmt: skip
            admin = stack.enter_context(proxy_process(
                upstream, model=MODEL, tokenizer=model_dir, log_url=f"local:{where / 'log'}",
                out=where, extra_args=extra))  # fmt: skip
            port = int(httpx.URL(admin.url).port or 0)
            out.append(Proxy(name, admin, pid_listening(port), where / "log"))
        yield out


def report(ps: list[Proxy], ended: int, sessions: int) -> None:
    print(
        "| sessions | " + " | ".join(f"{p.name}: RSS MB / live / finished kept" for p in ps) + " |"
    )
    print("|---|" + "---|" * len(ps))
    for rows in zip(*(p.samples for p in ps), strict=True):
        cells = [f"{mb:.0f} / {live:,} / {kept:,}" for _, mb, live, kept in rows]
        print(f"| {rows[0][0]:,} | " + " | ".join(cells) + " |")
    growth = {p.name: p.samples[-1][1] - p.samples[1][1] for p in ps}
    print(
        "memory growth after the first --every sessions (warm-up): "
        + ", ".join(f"{k} {v:+.0f} MB" for k, v in growth.items())
    )
    print(f"sessions ended for idleness (idle-ending proxy's log): {ended:,} of {sessions:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--every", type=int, default=500, help="sessions between samples")
    args = parser.parse_args()
    model_dir = build_tiny_model(default_tiny_dir())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="openforge-sessions-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}"
        argv = [
            "openforge.testing.fast_upstream",
            "--port",
            str(port),
            "--model-dir",
            str(model_dir),
        ]
        with (
            service("upstream", argv, tmp, f"{upstream}/v1/models"),
            proxies(upstream, model_dir, tmp) as ps,
        ):
            for p in ps:
                p.sample(0)
            asyncio.run(traffic(ps, args))
            ended = idle_ends(ps[0].log)
        report(ps, ended, args.sessions)
        assert ps[0].samples[-1][2] == 0, "the idle-ending proxy still holds live sessions"
        assert ended == args.sessions, (ended, args.sessions)
        assert ps[1].samples[-1][2] == args.sessions
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
