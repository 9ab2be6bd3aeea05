"""Latency a gateway adds to multi-turn agent conversations: direct to the upstream, through
OpenForge's capture proxy and through LiteLLM's proxy, side by side in one run.

    .venv/bin/python -m bench.proxy_overhead            # the full matrix, ~4 min on 2 cores
    .venv/bin/python -m bench.proxy_overhead --quick    # a 1-2 minute check
    .venv/bin/python -m bench.proxy_overhead --workers 1 2 4   # capacity per proxy worker count

Each client plays conversations as a harness does (:mod:`bench.proxy_threads`): a long system
prompt and tools (``--histories``: about 1k, 8k and 30k tokens of the served tokenizer), then a
new user message per turn, the whole history resent each turn with the assistant's previous
answer exactly as that path streamed it back. All three dialects (Chat Completions, Responses,
Anthropic Messages), streaming, at 1/16/64/256 clients (closed loop: a client sends its next
turn when the answer is in). Every thread is a rollout registered with the proxy; its calls
carry the rollout's key (the proxy runs with ``--require-keys``).

The paths, each measured alone in turn for every (dialect, history, clients) cell:

- direct: the upstream's own streaming Chat Completions endpoint with the same conversation (the
  upstream, ``openforge.testing.fast_upstream``, answers 16 tokens in vLLM's format with no
  model and speaks no other dialect);
- OpenForge: ``openforge proxy`` (one worker, the embedded local log) in the call's dialect;
- relay (Chat Completions cells only): :mod:`bench.relay`, a bare relay on the proxy's own
  server stack (uvicorn, Starlette, aiohttp, orjson) that renders and records nothing: the
  floor of what a gateway on this stack adds;
- LiteLLM: ``litellm[proxy]`` (one worker, a master key, ``model: custom_openai/NAME``) in all
  three dialects: that provider bridges Responses and Anthropic Messages through the upstream's
  Chat Completions (``openai/NAME`` would send both to the upstream's ``/v1/responses``, which
  this upstream does not serve). A dialect it answers with an error is reported and dropped.

Reported per cell: last-byte latency p50/p99 over each thread's calls after its first (the first
call of a thread renders its whole prompt on every path and is reported apart), "added" = path
minus direct at the same percentile, requests per second, and the continuity class of every
OpenForge call read back from its completion event, so a shortcut (a retry reusing recorded ids)
cannot pass for the render path. The run fails if a measured call is not an ``exact``
continuation, or if a call through the proxy has no completion event (lost).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import httpx
import uvloop

from bench.litellm_proxy import litellm_proxy
from bench.proxy_clients import Target, phase
from bench.proxy_report import Cell, Level, Phase, report
from bench.proxy_threads import Conversation, Prompt
from infra.eventlog import EVENTS_TOPIC, open_reader
from infra.local.process import ServiceProcess, free_port
from infra.paths import default_tiny_dir
from infra.proxy_client import ProxyAdmin
from infra.tiny_model import build_tiny_model
from openforge.stack import proxy_process
from schemas.codec import decode_message
from schemas.completion import CompletionEvent
from schemas.enums import Dialect, RolloutPhase

MODEL = "fast"
# LiteLLM translates these to the upstream's Chat Completions (each probed at start).
LITELLM_DIALECTS = (Dialect.CHAT, Dialect.RESPONSES, Dialect.MESSAGES)
PATHS = {
    Dialect.CHAT: "/v1/chat/completions",
    Dialect.RESPONSES: "/v1/responses",
    Dialect.MESSAGES: "/v1/messages",
}


# Sized for a few minutes on 2 cores (212 s with ``--workers 1 2`` on 4ca3814): LiteLLM serves
# ~15-35 calls/s whatever the concurrency, so it plays fewer turns, and none at 256 clients
# (``--litellm-256`` adds it).
FULL: tuple[Level, ...] = (
    Level(1, 5, 8, litellm=(2, 6)),
    Level(16, 1, 5, litellm=(1, 3)),
    Level(64, 1, 3, litellm=(1, 2)),
    Level(256, 1, 2, litellm=None),
)
QUICK: tuple[Level, ...] = (Level(1, 3, 6, litellm=(2, 4)), Level(16, 1, 3, litellm=(1, 2)))


class OpenForge:
    """A running proxy: registers one rollout per thread and finishes them after the phase."""

    def __init__(self, admin: ProxyAdmin) -> None:
        self.admin = admin
        self.client = httpx.Client(timeout=30)
        self.sent = 0

    def register(self, rollout_id: str, dialect: Dialect) -> Target:
        resp = self.client.post(
            f"{self.admin.url}/admin/rollouts",
            json={"rollout_id": rollout_id, "harness": "bench"},
            headers={"authorization": f"Bearer {self.admin.token}"},
        )
        resp.raise_for_status()
        got = resp.json()
        # A proxy with several workers answers with the URL of the worker the rollout is on.
        base = next((got[k] for k in ("base_url", "worker_url", "url") if got.get(k)), None)
        base = str(base or self.admin.url).rstrip("/")
        key = got["api_key"]
        if dialect is Dialect.MESSAGES:
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            url = f"{base}{got['anthropic_base_path']}/v1/messages"
        else:
            headers = {"authorization": f"Bearer {key}"}
            url = f"{base}{got['openai_base_path']}{PATHS[dialect][3:]}"
        return Target(url, {"content-type": "application/json", **headers}, rollout_id)

    def finish(self, rollout_ids: list[str]) -> None:
        for rid in rollout_ids:
            self.admin.finish_rollout(rid, RolloutPhase.FINISHED, exit_code=0)


def run_phase(
    path: str,
    dialect: Dialect,
    prompt: Prompt,
    level: Level,
    tag: str,
    urls: dict[str, str],
    proxy: OpenForge | None,
) -> Phase:
    """One path's phase of a cell; ``tag`` names its rollouts."""
    targets: list[list[Target]] = []
    convs: list[list[Conversation]] = []
    rollouts: list[str] = []
    for c in range(level.clients):
        ts, cs = [], []
        for t in range(level.threads):
            seed = c * 1000 + t
            cs.append(Conversation(prompt, seed, MODEL))
            if path == "openforge":
                assert proxy is not None
                rid = f"{tag}-c{c}-t{t}"
                rollouts.append(rid)
                ts.append(proxy.register(rid, dialect))
            elif path == "litellm":
                headers = {"authorization": f"Bearer {urls['litellm_key']}"}
                if dialect is Dialect.MESSAGES:
                    headers |= {"x-api-key": urls["litellm_key"], "anthropic-version": "2023-06-01"}
                headers["content-type"] = "application/json"
                ts.append(Target(urls["litellm"] + PATHS[dialect], headers))
            else:  # direct, or the bare relay (bench.relay) in front of the same upstream
                base = urls["relay"] if path == "relay" else urls["direct"]
                ts.append(Target(base + PATHS[Dialect.CHAT], {"content-type": "application/json"}))
        targets.append(ts)
        convs.append(cs)
    phase_dialect = Dialect.CHAT if path in ("direct", "relay") else dialect
    out = uvloop.run(phase(targets, convs, phase_dialect, level.turns))
    if proxy is not None and path == "openforge":
        proxy.sent += len(out.calls)
        proxy.finish(rollouts)
    return out


def read_events(log_dir: Path) -> dict[tuple[str, int], CompletionEvent]:
    """Every completion event in the log, by (rollout id, call index)."""
    out: dict[tuple[str, int], CompletionEvent] = {}
    with open_reader(f"local:{log_dir}", [EVENTS_TOPIC], group="bench") as reader:
        while records := reader.poll(max_records=5000, timeout=0.5):
            for rec in records:
                for r in decode_message(rec.value):
                    if isinstance(r, CompletionEvent):
                        out[(r.rollout_id, r.call_index)] = r
    return out


def prompt_for(tokens: int, proxy: OpenForge) -> Prompt:
    """A system prompt and tools of about ``tokens`` tokens in all, as the proxy renders them
    (its ``count_tokens`` of a thread's first Messages request)."""
    rollout = f"calibrate-{tokens}"
    target = proxy.register(rollout, Dialect.MESSAGES)
    url = target.url + "/count_tokens"

    def count(p: Prompt) -> int:
        conv = Conversation(p, 0, MODEL)
        conv.next_user()
        resp = proxy.client.post(url, json=conv.body(Dialect.MESSAGES), headers=target.headers)
        resp.raise_for_status()
        return int(resp.json()["input_tokens"])

    words = max(40, tokens // 3)
    for _ in range(4):  # tokens per word varies little: a few proportional steps converge
        words = max(40, int(words * tokens / count(Prompt.sized(words))))
    proxy.finish([rollout])
    return Prompt.sized(words)


@contextlib.contextmanager
def service(
    name: str, argv: list[str], tmp: Path, probe: str, env: dict[str, str] | None = None
) -> Iterator[int]:
    """``python -m ARGV`` (with ``env`` added to this one's) until the block ends; yields its
    pid once ``probe`` answers."""
    environ = {**os.environ, **(env or {})}
    proc = ServiceProcess(name, [sys.executable, "-m", *argv], tmp / f"{name}.log", env=environ)
    proc.start()
    try:
        proc.wait_ready(lambda: httpx.get(probe).is_success, 120)
        assert proc.pid is not None
        yield proc.pid
    finally:
        proc.stop()


@contextlib.contextmanager
def openforge_proxy(
    upstream: str, model_dir: Path, out: Path, workers: int, args: list[str]
) -> Iterator[OpenForge]:
    extra = ["--require-keys", "--max-concurrency", "1024", *args]
    if workers > 1:
        extra += ["--workers", str(workers)]
    with proxy_process(
        upstream,
        model=MODEL,
        tokenizer=model_dir,
        log_url=f"local:{out / 'log'}",
        out=out,
        extra_args=extra,
    ) as admin:
        yield OpenForge(admin)


def matrix(
    dialects: list[Dialect],
    histories: list[int],
    levels: tuple[Level, ...],
    prompts: dict[int, Prompt],
    urls: dict[str, str],
    proxy: OpenForge,
    litellm_dialects: list[Dialect],
) -> list[Cell]:
    """Every (dialect, history, clients) cell: direct, OpenForge, LiteLLM one after another."""
    warm = Level(2, 1, 3)
    for d in dialects:  # warm-up: imports, connections, caches of every path
        for path in ("direct", "openforge", "litellm", "relay"):
            if (path != "litellm" or d in litellm_dialects) and (path != "relay" or d == "chat"):
                run_phase(path, d, prompts[histories[0]], warm, f"warm-{d}", urls, proxy)
    cells = []
    for d in dialects:
        for h in histories:
            for lv in levels:
                cell = Cell(d, h, lv)
                tag = f"{d}-{h}-{lv.clients}"
                paths = ["direct", "openforge"] + (["relay"] if d is Dialect.CHAT else [])
                for path in paths:
                    cell.phases[path] = run_phase(path, d, prompts[h], lv, tag, urls, proxy)
                through = lv.through_litellm()
                if through is not None and d in litellm_dialects:
                    cell.phases["litellm"] = run_phase(
                        "litellm", d, prompts[h], through, tag, urls, proxy
                    )
                cells.append(cell)
                print(cell.progress(), flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 1-2 minute check")
    parser.add_argument("--histories", type=int, nargs="+", help="history sizes in tokens")
    parser.add_argument("--clients", type=int, nargs="+", help="client counts (of the levels)")
    parser.add_argument("--dialects", nargs="+", choices=[d.value for d in Dialect])
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1], help="proxy worker counts for capacity"
    )
    parser.add_argument(
        "--proxy-args", default="", help="extra `openforge proxy` options, e.g. '--no-fsync'"
    )
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM baseline")
    parser.add_argument("--litellm-256", action="store_true", help="LiteLLM at 256 clients too")
    args = parser.parse_args()
    levels = QUICK if args.quick else FULL
    pargs = args.proxy_args.split()
    if args.clients:
        levels = tuple(lv for lv in FULL if lv.clients in args.clients)
    if args.litellm_256:
        levels = tuple(replace(lv, litellm=lv.litellm or (1, 2)) for lv in levels)
    histories = args.histories or ([1000, 30000] if args.quick else [1000, 8000, 30000])
    dialects = [Dialect(d) for d in args.dialects] if args.dialects else list(Dialect)
    model_dir = build_tiny_model(default_tiny_dir())
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-"))
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    up_argv = ["openforge.testing.fast_upstream", "--port", str(up_port)]
    up_argv += ["--model-dir", str(model_dir)]
    t_start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(service("upstream", up_argv, tmp, f"{upstream}/v1/models"))
            proxy = stack.enter_context(openforge_proxy(upstream, model_dir, tmp / "w1", 1, pargs))
            prompts = {h: prompt_for(h, proxy) for h in histories}
            relay_port = free_port()
            relay = f"http://127.0.0.1:{relay_port}"
            relay_argv = ["bench.relay", "--port", str(relay_port), "--upstream", upstream]
            stack.enter_context(service("relay", relay_argv, tmp, f"{relay}/health"))
            urls = {"direct": upstream, "relay": relay}
            litellm_dialects: list[Dialect] = []
            if not args.no_litellm:
                gw = stack.enter_context(litellm_proxy(upstream, MODEL, tmp))
                urls |= {"litellm": gw.url, "litellm_key": gw.key}
                litellm_dialects = probe_litellm(urls, prompts[histories[0]])
            cells = matrix(dialects, histories, levels, prompts, urls, proxy, litellm_dialects)
            capacity = {1: cells} if args.workers == [1] else {}
            logs = [tmp / "w1" / "log"]
            if args.workers != [1]:
                h = histories[min(1, len(histories) - 1)]
                for w in args.workers:
                    out = tmp / f"capacity-{w}"
                    logs.append(out / "log")
                    with openforge_proxy(upstream, model_dir, out, w, pargs) as pw:
                        capacity[w] = [capacity_cell(pw, w, prompts[h], h, urls)]
                        proxy.sent += pw.sent
            time.sleep(1)  # the last records flushed
            events: dict[tuple[str, int], CompletionEvent] = {}
            for log in logs:
                events |= read_events(log)
        ok = report(cells, capacity, events, proxy.sent, litellm_dialects)
        print(f"\nwall time {time.perf_counter() - t_start:.0f} s")
        if not ok:
            sys.exit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def capacity_cell(
    pw: OpenForge, workers: int, prompt: Prompt, history: int, urls: dict[str, str]
) -> Cell:
    """256 clients of Chat Completions through a proxy of ``workers`` workers, and direct."""
    lv = Level(256, 1, 2)
    cell = Cell(Dialect.CHAT, history, lv)
    cell.phases["direct"] = run_phase("direct", Dialect.CHAT, prompt, lv, "", urls, None)
    tag = f"capacity{workers}"
    cell.phases["openforge"] = run_phase("openforge", Dialect.CHAT, prompt, lv, tag, urls, pw)
    return cell


def probe_litellm(urls: dict[str, str], prompt: Prompt) -> list[Dialect]:
    """The dialects LiteLLM answers on this upstream (one streamed turn each)."""
    ok = []
    for d in LITELLM_DIALECTS:
        try:
            run_phase("litellm", d, prompt, Level(1, 1, 2), "probe", urls, None)
            ok.append(d)
        except (RuntimeError, aiohttp.ClientError, KeyError, ValueError) as exc:
            print(f"LiteLLM does not serve {d} on this upstream: {str(exc)[:300]}")
    return ok


if __name__ == "__main__":
    main()
