"""The capture proxy's CPU per call, stage by stage: ``/proc`` CPU time and a sampling profile.

    .venv/bin/python -m bench.proxy_cpu_budget                  # ~2 min on 2 cores
    .venv/bin/python -m bench.proxy_cpu_budget --proxy-args=--no-fsync --calls 400

What runs: the same clients, upstream and proxy as ``bench.proxy_overhead`` (one client,
multi-turn threads of about 1k and 30k tokens, streaming, all three dialects, each call an
``exact`` continuation: read back from its completion event, or the run fails), and
``bench.relay``, a bare relay on the proxy's server stack, in the Chat Completions cells.

Per cell, two passes of ``--calls`` calls each:

1. CPU: the proxy process's user + system time (``/proc/PID/stat``, every thread: the event
   loop and the publisher's thread) over the pass, divided by its calls; the relay's the same
   way. Nothing samples the process in this pass.
2. Stages: ``py-spy record --nonblocking`` samples every thread of the proxy (busy samples only)
   through a second pass; each sample goes to the stage of the innermost frame a rule below
   names (the leaf first: a jinja2 frame under ``proxy/render.py`` is rendering, a
   ``proxy/render.py`` ``encode`` frame is tokenizing). A stage's CPU per call is its share of
   the samples times the CPU per call of pass 1.

The stages are those of issue 31: parse (body bytes to a call request), attribution (the
rollout and its key), continuity (which recorded call this one extends), render (the chat
template), tokenize, upstream I/O (the engine request and its stream), response (the dialect's
stream to the client), event build (the completion event and its redaction), encode (Arrow
frames), durable write (the event log), and what is neither ours nor a stage: the server and
event loop (uvicorn, Starlette, asyncio, uvloop), the call's own bookkeeping, and the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import linecache
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.proxy_overhead import (
    OpenForge,
    openforge_proxy,
    prompt_for,
    read_events,
    run_phase,
    service,
)
from bench.proxy_report import Level, Phase
from bench.proxy_threads import Prompt
from infra.local.process import free_port
from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from schemas.enums import Dialect

STAGES = (
    "parse",
    "attribution",
    "continuity",
    "render",
    "tokenize",
    "upstream I/O",
    "response",
    "event build",
    "encode",
    "durable write",
    "metrics",
    "call bookkeeping",
    "server and event loop",
    "other",
)
_RESPONSE_FUNCS = {
    "respond", "stream", "_chunk", "start", "text", "tool_call", "finish", "_usage", "_tool_call",
    "sse", "stream_error", "_event", "_item", "_block",
}  # fmt: skip
# (stage, substring of the frame's file, function names or None for any): first match wins
# within a frame; the innermost frame that matches decides the sample.
RULES: tuple[tuple[str, str, frozenset[str] | None], ...] = (
    ("tokenize", "proxy/render.py", frozenset({"encode", "decode", "decode_text"})),
    ("tokenize", "/tokenizers/", None),
    ("render", "/jinja2/", None),
    ("render", "<template>", None),
    ("render", "proxy/render.py", None),
    ("render", "/transformers/", None),
    ("continuity", "proxy/continuity.py", None),
    ("continuity", "proxy/canonical.py", None),
    ("attribution", "proxy/attribution.py", None),
    ("attribution", "proxy/credentials.py", None),
    ("attribution", "proxy/rollouts.py", None),
    ("attribution", "proxy/gate.py", None),
    ("parse", "proxy/bodies.py", None),
    ("response", "proxy/dialects/", frozenset(_RESPONSE_FUNCS)),
    ("parse", "proxy/dialects/", None),
    ("response", "proxy/toolparse.py", None),
    ("response", "proxy/calls.py", frozenset({"_encode", "_sse", "__call__", "watch"})),
    ("upstream I/O", "proxy/upstream.py", None),
    ("upstream I/O", "proxy/generation.py", None),
    ("upstream I/O", "proxy/pool.py", None),
    ("upstream I/O", "/aiohttp/", None),
    ("upstream I/O", "/yarl/", None),
    ("upstream I/O", "/multidict/", None),
    ("event build", "proxy/recording.py", None),
    ("event build", "proxy/redaction.py", None),
    ("event build", "schemas/delta.py", None),
    ("event build", "proxy/recorder.py", frozenset({"call", "_publish", "_count_redactions"})),
    ("encode", "schemas/codec.py", None),
    ("encode", "/pyarrow/", None),
    ("durable write", "proxy/publisher.py", None),
    ("durable write", "infra/eventlog/", None),
    ("durable write", "proxy/deadletter.py", None),
    ("metrics", "proxy/metrics.py", None),
    ("metrics", "/prometheus_client/", None),
    ("call bookkeeping", "/proxy/", None),
    ("call bookkeeping", "/schemas/", None),
    ("server and event loop", "/uvicorn/", None),
    ("server and event loop", "/starlette/", None),
    ("server and event loop", "/asyncio/", None),
    ("server and event loop", "/uvloop/", None),
    ("server and event loop", "/httptools/", None),
)


WAITING = "waiting (not CPU)"
FSYNC = "fsync (waiting on the disk)"
# Leaf frames of a thread that waits: py-spy can count a timed lock wait as busy.
_WAITS = {"Condition.wait", "Event.wait", "Thread.join", "Queue.get"}


def stage_of(stack: list[tuple[str, str, int]]) -> str:
    """The stage of one sample: ``stack`` is (function, file, line) from the root to the leaf.
    Methods are matched by their own name (py-spy names them ``Class.method``)."""
    func, path, line = stack[-1]
    if func in _WAITS:
        return WAITING
    if "fsync(" in linecache.getline(path, line):
        return FSYNC
    for func, path, _ in reversed(stack):
        name = func.rsplit(".", 1)[-1]
        for stage, needle, funcs in RULES:
            if needle in path and (funcs is None or name in funcs):
                return stage
    return "other"


def parse_raw(text: str) -> Counter[str]:
    """Samples per stage from py-spy's raw (collapsed) output: ``f (file:line);... count``."""
    out: Counter[str] = Counter()
    for row in text.splitlines():
        frames, _, count = row.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        stack = []
        for frame in frames.split(";"):
            func, _, where = frame.partition(" (")
            path, _, line = where.rstrip(")").rpartition(":")
            stack.append((func, path, int(line) if line.isdigit() else 0))
        out[stage_of(stack)] += int(count)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_listening(port: int) -> int:
    """The process whose command line serves ``--port PORT`` (the proxy's)."""
    needle = f"--port\0{port}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes() + b"\0":
                    return int(entry.name)
    raise SystemExit(f"no process serves port {port}")


@contextlib.contextmanager
def sampling(pid: int, out: Path, rate: int) -> Iterator[None]:
    """py-spy samples ``pid`` (every thread, busy samples only) until the block ends."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found: run `scripts/setup project` (the dev extra has it)")
    argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking"]
    argv += ["--full-filenames", "--format", "raw", "-o", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if not out.exists():
            raise SystemExit(f"py-spy wrote no profile: {err.decode()[-500:]}")


@dataclass
class Budget:
    """One cell: CPU per call of the proxy and of the relay, and samples per stage."""

    dialect: Dialect
    history: int
    calls: int = 0
    cpu_ms: float = 0.0
    relay_cpu_ms: float | None = None
    samples: Counter[str] = field(default_factory=Counter)
    phases: list[tuple[str, Phase]] = field(default_factory=list)

    @property
    def cpu_samples(self) -> int:
        """Samples of a thread at work (not waiting on a lock or on the disk)."""
        return self.samples.total() - self.samples[WAITING] - self.samples[FSYNC]

    def share(self, stage: str) -> float:
        return self.samples[stage] / self.cpu_samples if self.cpu_samples else 0.0


def measure(
    budget: Budget, level: Level, prompt: Prompt, urls: dict[str, str], proxy: OpenForge,
    pids: dict[str, int], tmp: Path, rate: int, keep: Path | None,
) -> None:  # fmt: skip
    """The two passes of one cell (and the relay's CPU pass in Chat Completions cells)."""
    tag = f"{budget.dialect}-{budget.history}"
    before = cpu_seconds(pids["proxy"])
    out = run_phase("openforge", budget.dialect, prompt, level, f"{tag}-cpu", urls, proxy)
    budget.cpu_ms = (cpu_seconds(pids["proxy"]) - before) * 1000 / len(out.calls)
    budget.calls = len(out.calls)
    budget.phases.append((f"{tag}-cpu", out))
    profile = tmp / f"{tag}.raw"
    with sampling(pids["proxy"], profile, rate):
        out = run_phase("openforge", budget.dialect, prompt, level, f"{tag}-spy", urls, proxy)
    budget.phases.append((f"{tag}-spy", out))
    budget.samples = parse_raw(profile.read_text())
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(profile, keep / profile.name)
    if budget.dialect is Dialect.CHAT:
        before = cpu_seconds(pids["relay"])
        out = run_phase("relay", Dialect.CHAT, prompt, level, "", urls, None)
        budget.relay_cpu_ms = (cpu_seconds(pids["relay"]) - before) * 1000 / len(out.calls)


def check_exact(budgets: list[Budget], log_dir: Path) -> tuple[int, int]:
    """Every measured call (after each thread's first) must be an ``exact`` continuation with
    its completion event: (calls checked, first calls)."""
    time.sleep(1)  # the last records flushed
    events = read_events(log_dir)
    checked = firsts = 0
    for b in budgets:
        for _, phase in b.phases:
            for rollout, turn, _, _ in phase.calls:
                event = events.get((rollout, turn))
                if event is None:
                    raise SystemExit(f"call {rollout}#{turn} has no completion event: lost")
                want = "first" if turn == 0 else "exact"
                if str(event.continuity) != want:
                    raise SystemExit(f"call {rollout}#{turn} is {event.continuity}, not {want}")
                checked, firsts = checked + 1, firsts + (turn == 0)
    return checked, firsts


def _row(name: str, cells: list[str]) -> str:
    return f"| {name} | " + " | ".join(cells) + " |"


def report(budgets: list[Budget], checked: int, firsts: int) -> None:
    print(_row("stage: CPU ms per call (share)", [f"{b.dialect} {b.history:,}" for b in budgets]))
    print("|---|" + "---|" * len(budgets))
    for stage in STAGES:
        cells = []
        for b in budgets:
            cells.append(f"{b.cpu_ms * b.share(stage):.2f} ({100 * b.share(stage):.0f}%)")
        print(_row(stage, cells))
    print(_row("**all (`/proc`)**", [f"**{b.cpu_ms:.2f}**" for b in budgets]))
    relay = [f"{b.relay_cpu_ms:.2f}" if b.relay_cpu_ms is not None else "-" for b in budgets]
    print(_row("bare relay (`/proc`)", relay))
    print(
        _row("calls per pass / samples at work", [f"{b.calls} / {b.cpu_samples}" for b in budgets])
    )
    for name in (FSYNC, WAITING):  # not CPU: samples per call, at the sampling rate
        print(
            _row(f"{name}, samples per call", [f"{b.samples[name] / b.calls:.2f}" for b in budgets])
        )
    print(
        f"\nContinuity read back: {checked} calls, each with its completion event; "
        f"{checked - firsts} `exact`, {firsts} `first` (each thread's first call)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per pass and cell")
    parser.add_argument("--histories", type=int, nargs="+", default=[1000, 30000])
    parser.add_argument("--dialects", nargs="+", choices=[d.value for d in Dialect])
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--proxy-args", default="", help="extra `openforge proxy` options")
    parser.add_argument("--keep", type=Path, help="keep the raw profiles in this directory")
    args = parser.parse_args()
    dialects = [Dialect(d) for d in args.dialects] if args.dialects else list(Dialect)
    turns = 8  # a 30k-token thread stays inside the tiny model's 32k context
    level = Level(1, max(1, args.calls // turns), turns)
    model_dir = build_tiny_model(default_tiny_dir())
    tmp = Path(tempfile.mkdtemp(prefix="openforge-budget-"))
    up_port, relay_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    up_argv = ["openforge.testing.fast_upstream", "--port", str(up_port), "--model-dir"]
    relay = f"http://127.0.0.1:{relay_port}"
    relay_argv = ["bench.relay", "--port", str(relay_port), "--upstream", upstream]
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                service("upstream", [*up_argv, str(model_dir)], tmp, f"{upstream}/v1/models")
            )
            proxy = stack.enter_context(
                openforge_proxy(upstream, model_dir, tmp / "w1", 1, args.proxy_args.split())
            )
            pids = {
                "proxy": pid_listening(int(httpx.URL(proxy.admin.url).port or 0)),
                "relay": stack.enter_context(service("relay", relay_argv, tmp, f"{relay}/health")),
            }
            urls = {"direct": upstream, "relay": relay}
            prompts = {h: prompt_for(h, proxy) for h in args.histories}
            warm, first = Level(1, 2, 4), prompts[args.histories[0]]
            for d in dialects:  # warm-up: imports, connections, caches
                run_phase("openforge", d, first, warm, f"warm-{d}", urls, proxy)
            run_phase("relay", Dialect.CHAT, first, warm, "", urls, None)
            budgets = []
            for d in dialects:
                for h in args.histories:
                    budget = Budget(d, h)
                    measure(budget, level, prompts[h], urls, proxy, pids, tmp, args.rate, args.keep)
                    budgets.append(budget)
                    print(f"{d} {h:,}: {budget.cpu_ms:.2f} ms CPU a call", flush=True)
        checked, firsts = check_exact(budgets, tmp / "w1" / "log")
        print()
        report(budgets, checked, firsts)
        print(f"\nproxy options: {args.proxy_args or '(defaults: fsync on)'}; wall time "
              f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
