"""Claim to agent ready: the built-in agent's sandbox from a warm pool vs a cold one, side by
side (issue 50, item 2).

    .venv/bin/python -m bench.warm_start [--rollouts 40] [--concurrency 4] [--sandbox runc]

Code paths, in blocks A-B-B-A so that load hits both alike, each block ``--rollouts`` agent
starts at ``--concurrency`` at once:

- ``cold``: ``SandboxBackend.run`` of the agent's spec as ``LocalBackend`` builds it (the
  ``agent`` harness's ``invocation``, its interpreter and the rollout's home and workspace
  mounted, the proxy endpoint), in a container of ``python:3.11-slim`` (the stand-in base of the
  main job's tasks) or in bubblewrap;
- ``warm``: the same spec served by a :class:`~infra.sandbox.warm_pool.WarmPool` member of size
  ``--concurrency`` (``pool.claim`` then ``Member.run``), whose stand-by process preloaded the
  agent's modules (``Agent.preload``).

Ready is from asking (``backend.run``, or ``pool.claim`` for the warm path) to the agent's first
HTTP request arriving at the proxy's Unix socket. A sink listens there instead of the proxy:
it notes the arrival and answers 400, so each agent then ends on its own (the model is not what
is measured). Rollouts/min is over each block's wall time, agent start to sandbox end.
Proof of path: every warm rollout is served by a member (``pool.stats.served``, and the
member's directory as its home); every cold one ran in its own sandbox with a start time.
"""

from __future__ import annotations

import argparse
import os
import socketserver
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from infra.harnesses.agent import Agent
from infra.harnesses.base import Endpoint, RolloutDirs
from infra.images import ImageStore
from infra.sandbox import (
    BubblewrapSandbox,
    Mount,
    ProxyEndpoint,
    RootFs,
    RuncSandbox,
    SandboxBackend,
    SandboxSpec,
)
from infra.sandbox.warm_member import Shape
from infra.sandbox.warm_pool import WarmPool

IMAGE = "localhost/python:3.11-slim"
PORT = 18123


class Sink(socketserver.ThreadingUnixStreamServer):
    """Notes when each rollout's first request arrives; answers 400."""

    daemon_threads = True

    def __init__(self, path: Path) -> None:
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()
        super().__init__(str(path), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Sink

    def do_POST(self) -> None:
        now = time.monotonic()
        parts = self.path.split("/")  # /rollout/{id}/v1/chat/completions
        rollout = parts[2] if len(parts) > 2 and parts[1] == "rollout" else "?"
        with self.server.lock:
            self.server.first.setdefault(rollout, now)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'{"error": {"message": "bench sink: no model here", "type": "invalid_request"}}'
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Bench:
    def __init__(self, backend: SandboxBackend, root: RootFs | None, tmp: Path, sink: Sink):
        self.backend, self.root, self.tmp, self.sink = backend, root, tmp, sink
        self.agent = Agent(max_turns=1, retries=0)
        self.proxy = ProxyEndpoint(tmp / "proxy.sock", PORT)
        self.n = 0
        self.lock = threading.Lock()

    def spec(self, rollout: str, home: Path) -> SandboxSpec:
        root = self.tmp / rollout
        inv = self.agent.invocation(
            "Write the word bench to answer.txt.",
            Endpoint(self.proxy.base_url, rollout, "key-" + rollout, "tiny"),
            RolloutDirs(home, Path("/app")),
            60.0,
        )
        mounts = [
            Mount(root / "workspace", "/app", read_only=False),
            Mount(home, str(home), read_only=False),
            *(Mount(p, str(p), read_only=True) for p in self.agent.read_only_paths()),
        ]
        return SandboxSpec(
            argv=tuple(inv.argv),
            stdout=root / "agent.out",
            stderr=root / "agent.err",
            cwd="/app",
            env=inv.env,
            mounts=tuple(mounts),
            proxy=self.proxy,
            timeout_s=60.0,
            home=str(home),
            root=self.root,
        )

    def _new(self) -> tuple[str, Path]:
        with self.lock:
            self.n += 1
            rollout = f"r{self.n}"
        root = self.tmp / rollout
        for d in ("workspace", "home"):
            (root / d).mkdir(parents=True)
        return rollout, root

    def cold(self) -> tuple[float, float, bool]:
        rollout, root = self._new()
        asked = time.monotonic()
        result = self.backend.run(self.spec(rollout, root / "home"))
        assert result.start_s is not None and result.start_s > 0, result
        return self._ready(rollout, asked), time.monotonic() - asked, False

    def warm(self, pool: WarmPool) -> tuple[float, float, bool]:
        rollout, root = self._new()
        asked = time.monotonic()
        draft = self.spec(rollout, root / "home")
        preload = self.agent.preload()
        shape = Shape.of(draft, root, self.backend, preload.python, preload.modules)
        assert shape is not None
        member = pool.claim(shape)
        if member is None:  # none ready: cold, as LocalBackend runs it
            self.backend.run(draft)
        else:
            member.run(self.spec(rollout, member.home), root, root / "home")
        return self._ready(rollout, asked), time.monotonic() - asked, member is not None

    def _ready(self, rollout: str, asked: float) -> float:
        with self.sink.lock:
            first = self.sink.first.get(rollout)
        assert first is not None, f"{rollout} never called: {(self.tmp / rollout / 'agent.err')}"
        return first - asked


@dataclass
class Block:
    """One block's figures: ready and sandbox wall times (ms), rollouts/min, members served."""

    ready: list[float]
    ready_served: list[float]
    wall: list[float]
    per_min: float
    warm: int


def _block(bench: Bench, mode: str, n: int, concurrency: int) -> Block:
    pool = WarmPool(concurrency, root=bench.tmp / "warm") if mode == "warm" else None
    try:
        if pool is not None:  # the pool as a run has it: asked for once, then kept full
            bench.warm(pool)
            while pool.ready() < concurrency:
                time.sleep(0.05)
        start = time.monotonic()
        with ThreadPoolExecutor(concurrency) as ex:
            futures = [
                ex.submit(bench.warm, pool) if pool is not None else ex.submit(bench.cold)
                for _ in range(n)
            ]
            rows = [f.result() for f in futures]
        wall = time.monotonic() - start
    finally:
        if pool is not None:
            pool.close()
    return Block(
        ready=[r[0] * 1000 for r in rows],
        ready_served=[r[0] * 1000 for r in rows if r[2]],
        wall=[r[1] * 1000 for r in rows],
        per_min=n / wall * 60,
        warm=sum(1 for r in rows if r[2]),
    )


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=40, help="agent starts per block")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sandbox", choices=["runc", "bubblewrap"], default="runc")
    args = parser.parse_args()
    if args.sandbox == "runc":
        backend: SandboxBackend = RuncSandbox()
        root: RootFs | None = RootFs(ImageStore().rootfs(IMAGE))
    else:
        backend, root = BubblewrapSandbox(), None
    with tempfile.TemporaryDirectory(prefix="openforge-bench-warm-") as tmp:
        t = Path(tmp)
        sink = Sink(t / "proxy.sock")
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        bench = Bench(backend, root, t, sink)
        results: dict[str, list[Block]] = {"cold": [], "warm": []}
        for mode in ("cold", "warm", "warm", "cold"):
            results[mode].append(_block(bench, mode, args.rollouts, args.concurrency))
        sink.shutdown()
    _report(results, args)


def _report(results: dict[str, list[Block]], args: argparse.Namespace) -> None:
    print(
        f"{args.sandbox}, {args.rollouts} agent starts per block, blocks cold-warm-warm-cold, "
        f"concurrency {args.concurrency}, {os.cpu_count()} cores"
    )
    print(
        "| path | ready p50 ms | ready p90 ms | served warm: ready p50 ms | sandbox wall p50 ms "
        "| rollouts/min | served warm |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, blocks in results.items():
        ready = [v for b in blocks for v in b.ready]
        wall = [v for b in blocks for v in b.wall]
        rate = statistics.mean(b.per_min for b in blocks)
        warm = sum(b.warm for b in blocks)
        served = [v for b in blocks for v in b.ready_served]
        served_p50 = f"{_pct(served, 0.5):.0f}" if served else "-"
        print(
            f"| {mode} | {_pct(ready, 0.5):.0f} | {_pct(ready, 0.9):.0f} | {served_p50} | "
            f"{_pct(wall, 0.5):.0f} | {rate:.0f} | {warm}/{len(ready)} |"
        )


if __name__ == "__main__":
    main()
