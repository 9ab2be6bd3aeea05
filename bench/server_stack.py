"""The proxy's server stack by measurement: the same bare relay served by uvicorn (the stack
``openforge proxy`` runs on) and by granian (a Rust HTTP server that serves the same Starlette
app), side by side in one run.

    .venv/bin/python -m bench.server_stack [--clients 1 16 64] [--history 1000]

What runs: ``openforge.testing.fast_upstream`` (16 tokens in vLLM's streaming format, no model),
and :mod:`bench.relay` (Starlette, aiohttp, orjson: body parsed and re-sent, the stream relayed
chunk by chunk) twice: ``proxy.serve`` (uvicorn with uvloop and httptools, as the proxy) and
``granian --interface asgi --workers 1 --loop uvloop --factory bench.relay:app_from_env``.
Clients (:mod:`bench.proxy_threads`) play multi-turn Chat Completions threads with a system
prompt and tools of about ``--history`` tokens, closed loop; per client count, each path alone
in turn: direct to the upstream, the relay on uvicorn, the relay on granian. Reported: added
latency (path minus direct, last byte, p50/p99 over each thread's calls after its first),
requests per second, and the server's CPU per call (user + system of its process and its
children from ``/proc``: granian serves from a worker process). Every call must be answered
200 (the clients raise otherwise), and its streamed answer goes into the thread's next turn.

granian is not a dependency of the project (it lost: bench/RESULTS.md): on first use it is
installed into ``$OPENFORGE_CACHE/bench/granian-VERSION`` (``pip install --target``, no deps:
it needs only click, which the project has) and put on the server's ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from pathlib import Path

from bench.packages import package_dir
from bench.proxy_cpu_budget import cpu_seconds
from bench.proxy_overhead import run_phase, service
from bench.proxy_report import Level, Phase, pct
from bench.proxy_threads import Prompt
from infra.local.process import free_port
from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from schemas.enums import Dialect

GRANIAN = "2.8.9"
LEVELS = {1: Level(1, 25, 8), 16: Level(16, 4, 8), 64: Level(64, 2, 8)}


def granian_dir(version: str = GRANIAN) -> Path:
    """A directory with granian installed (built on first use)."""
    return package_dir("granian", version)


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def measure(
    path: str, level: Level, prompt: Prompt, urls: dict[str, str], pid: int | None
) -> tuple[Phase, float]:
    """One phase through ``urls[path]``; with ``pid``, that server's CPU ms per call."""
    before = tree_cpu(pid) if pid else 0.0
    out = run_phase("relay", Dialect.CHAT, prompt, level, "", {"relay": urls[path]}, None)
    return out, ((tree_cpu(pid) - before) * 1000 / len(out.calls) if pid else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=list(LEVELS), choices=LEVELS)
    parser.add_argument("--history", type=int, default=1000, help="system prompt + tools, tokens")
    parser.add_argument(
        "--granian-args", default="", help="more granian options, e.g. '--runtime-mode st'"
    )
    args = parser.parse_args()
    model_dir = build_tiny_model(default_tiny_dir())
    tmp = Path(tempfile.mkdtemp(prefix="openforge-stack-"))
    ports = {k: free_port() for k in ("upstream", "uvicorn", "granian")}
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    upstream = ["openforge.testing.fast_upstream", "--port", str(ports["upstream"]), "--model-dir"]
    uvicorn = ["bench.relay", "--port", str(ports["uvicorn"]), "--upstream", urls["upstream"]]
    granian = ["granian", "--interface", "asgi", "--host", "127.0.0.1", "--port",
               str(ports["granian"]), "--workers", "1", "--loop", "uvloop", "--no-ws",
               "--log-level", "warning", "--factory", "bench.relay:app_from_env",
               *args.granian_args.split()]  # fmt: skip
    # ~3 words a token: the same sizing as bench.proxy_overhead's calibrated prompts
    prompt = Prompt.sized(max(40, args.history // 3))
    started = time.perf_counter()
    rows = []
    try:
        with contextlib.ExitStack() as stack:
            up_probe = f"{urls['upstream']}/v1/models"
            stack.enter_context(service("upstream", [*upstream, str(model_dir)], tmp, up_probe))
            envs = {
                "uvicorn": {},
                "granian": {
                    "OPENFORGE_RELAY_UPSTREAM": urls["upstream"],
                    "PYTHONPATH": str(granian_dir()),
                },
            }
            pids = {
                name: stack.enter_context(
                    service(name, argv, tmp, f"{urls[name]}/health", envs[name])
                )
                for name, argv in (("uvicorn", uvicorn), ("granian", granian))
            }
            paths = {"direct": urls["upstream"], **{k: urls[k] for k in pids}}
            for path in paths:  # warm-up: connections, imports
                measure(path, Level(2, 1, 3), prompt, paths, pids.get(path))
            for clients in args.clients:
                level = LEVELS[clients]
                got = {p: measure(p, level, prompt, paths, pids.get(p)) for p in paths}
                rows.append((clients, got))
                print(f"{clients} clients done", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"granian options: {' '.join(granian[1:])}")
    report(rows, args.history, time.perf_counter() - started)


def _p50_p99(phase: Phase) -> tuple[float, float]:
    """Last-byte latency p50 and p99 in ms over each thread's calls after its first."""
    return pct(phase.totals(), 0.5) * 1000, pct(phase.totals(), 0.99) * 1000


Rows = list[tuple[int, dict[str, tuple[Phase, float]]]]


def report(rows: Rows, history: int, wall: float) -> None:
    print(f"\nrelay on uvicorn vs on granian, Chat Completions, ~{history:,}-token prompt\n")
    print(
        "| clients | calls per path | direct p50 / p99 ms | uvicorn added p50 / p99 ms | "
        "granian added p50 / p99 ms | req/s direct / uvicorn / granian | "
        "server CPU ms per call uvicorn / granian |"
    )
    print("|---|---|---|---|---|---|---|")
    for clients, got in rows:
        lat = {p: _p50_p99(ph) for p, (ph, _) in got.items()}
        d50, d99 = lat["direct"]
        added = {p: f"{v[0] - d50:.2f} / {v[1] - d99:.2f}" for p, v in lat.items()}
        rates = " / ".join(f"{got[p][0].rate:,.0f}" for p in ("direct", "uvicorn", "granian"))
        print(
            f"| {clients} | {len(got['direct'][0].calls)} | {d50:.2f} / {d99:.2f} | "
            f"{added['uvicorn']} | {added['granian']} | {rates} | "
            f"{got['uvicorn'][1]:.2f} / {got['granian'][1]:.2f} |"
        )
    print(f"\nwall time {wall:.0f} s")


if __name__ == "__main__":
    main()
