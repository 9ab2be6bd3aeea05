"""Latency the proxy adds, measured side by side against calling the upstream directly.

    .venv/bin/python -m bench.proxy_overhead [--requests 640] [--token-delay-ms 20]

A fast upstream (``openforge.testing.fast_upstream``: vLLM's response format, 16 tokens per answer, no model)
runs in one process, the proxy (writing to the embedded local log) in another, the clients
(aiohttp on uvloop) in this one: three processes on the machine's cores. Streaming Chat
Completions requests alternate between the upstream's own endpoint and the proxy.

- 1 client, instant upstream: the proxy's own per-request latency.
- 64 clients, upstream paced at ``--token-delay-ms`` per token like an engine decoding: the
  latency the proxy adds while it carries 64 concurrent streams.
- Capacity: 64 clients without pause against the instant upstream, direct and through the proxy
  one after the other: requests per second (throughput, not latency).

Reported per path: time to first byte and to the last byte, p50 and p99; "added" is proxy minus
direct at each percentile. Events lost = requests through the proxy minus completion events in
the log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import uvloop

from infra.eventlog import EVENTS_TOPIC, open_reader
from infra.local.process import ServiceProcess, free_port
from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from schemas.codec import decode_message
from schemas.completion import CompletionEvent

BODY = {
    "model": "agent",
    "stream": True,
    "max_tokens": 16,
    "messages": [
        {"role": "system", "content": "You are a coding agent working in a repository. " * 8},
        {"role": "user", "content": "List the files, then fix the failing test."},
    ],
}
PAYLOAD = json.dumps(BODY).encode()
HEADERS = {"content-type": "application/json"}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _one(client: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = 0.0
    async with client.post(url, data=PAYLOAD, headers=HEADERS) as resp:
        resp.raise_for_status()
        async for _ in resp.content.iter_any():
            if not first:
                first = time.perf_counter() - t0
    return first, time.perf_counter() - t0


async def _side_by_side(
    direct: str, proxied: str, clients: int, requests: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in ("d_first", "d_total", "p_first", "p_total")}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients * 2)) as client:
        for url in (direct, proxied):  # warm-up
            for _ in range(20):
                await _one(client, url)

        async def worker() -> None:
            # Each client's first round is a warm-up under concurrency (connections opening,
            # all clients arriving at once) and is not counted: the figures are steady state.
            for i in range(max(1, requests // clients) + 1):
                for tag, url in (("d", direct), ("p", proxied)):
                    first, total = await _one(client, url)
                    if i:
                        out[f"{tag}_first"].append(first)
                        out[f"{tag}_total"].append(total)

        await asyncio.gather(*(worker() for _ in range(clients)))
    return out


async def _capacity(url: str, clients: int, requests: int) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients * 2)) as client:

        async def worker() -> None:
            for _ in range(requests // clients):
                await _one(client, url)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return (requests // clients * clients) / (time.perf_counter() - t0)


def _count_events(log_dir: Path) -> int:
    n = 0
    with open_reader(f"local:{log_dir}", [EVENTS_TOPIC], group="bench") as reader:
        while records := reader.poll(max_records=5000, timeout=0.2):
            n += sum(
                isinstance(r, CompletionEvent) for rec in records for r in decode_message(rec.value)
            )
    return n


def _service(name: str, argv: list[str], tmp: Path, probe: str) -> ServiceProcess:
    proc = ServiceProcess(name, [sys.executable, "-m", *argv], tmp / f"{name}.log")
    proc.start()
    proc.wait_ready(lambda: httpx.get(probe).is_success, 120)
    return proc


def _row(clients: int, label: str, r: dict[str, list[float]]) -> None:
    for tag, name in (("d", "direct"), ("p", "proxy")):
        f, t = r[f"{tag}_first"], r[f"{tag}_total"]
        print(
            f"| {clients} | {label} | {name} | "
            f"{_pct(f, 0.5) * 1e3:.2f} / {_pct(f, 0.99) * 1e3:.2f} | "
            f"{_pct(t, 0.5) * 1e3:.2f} / {_pct(t, 0.99) * 1e3:.2f} |"
        )
    added = [
        (_pct(r[f"p_{k}"], q) - _pct(r[f"d_{k}"], q)) * 1e3
        for k in ("first", "total")
        for q in (0.5, 0.99)
    ]
    print(
        f"| {clients} | {label} | **added** | **{added[0]:.2f} / {added[1]:.2f}** | "
        f"**{added[2]:.2f} / {added[3]:.2f}** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=640, help="requests per path and level")
    parser.add_argument("--token-delay-ms", type=float, default=20.0)
    args = parser.parse_args()
    model = build_tiny_model(default_tiny_dir())
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-"))
    ports = {k: free_port() for k in ("instant", "paced", "p_instant", "p_paced")}
    procs: list[ServiceProcess] = []
    try:
        for kind, delay in (("instant", 0.0), ("paced", args.token_delay_ms)):
            procs.append(
                _service(
                    f"upstream-{kind}",
                    [
                        "openforge.testing.fast_upstream",
                        "--port",
                        str(ports[kind]),
                        "--model-dir",
                        str(model),
                        "--token-delay-ms",
                        str(delay),
                    ],
                    tmp,
                    f"http://127.0.0.1:{ports[kind]}/v1/models",
                )
            )
            procs.append(
                _service(
                    f"proxy-{kind}",
                    [
                        "openforge",
                        "proxy",
                        "--upstream",
                        f"http://127.0.0.1:{ports[kind]}",
                        "--log",
                        f"local:{tmp / 'events'}",
                        "--spool",
                        str(tmp / f"spool-{kind}"),
                        "--port",
                        str(ports["p_" + kind]),
                        "--auto-register",
                        "--max-concurrency",
                        "1024",
                    ],
                    tmp,
                    f"http://127.0.0.1:{ports['p_' + kind]}/health",
                )
            )

        def urls(kind: str, rollout: str) -> tuple[str, str]:
            return (
                f"http://127.0.0.1:{ports[kind]}/v1/chat/completions",
                f"http://127.0.0.1:{ports['p_' + kind]}/rollout/{rollout}/v1/chat/completions",
            )

        print("| clients | upstream | path | first byte p50 / p99 ms | last byte p50 / p99 ms |")
        print("|---|---|---|---|---|")
        sent = 0
        r = uvloop.run(_side_by_side(*urls("instant", "one"), 1, args.requests))
        sent += len(r["p_total"]) + 20 + 1
        _row(1, "instant", r)
        r = uvloop.run(_side_by_side(*urls("paced", "many"), 64, args.requests))
        sent += len(r["p_total"]) + 20 + 64
        _row(64, f"{args.token_delay_ms:g} ms/token", r)
        direct, proxied = urls("instant", "capacity")
        cap_direct = uvloop.run(_capacity(direct, 64, args.requests * 2))
        cap_proxy = uvloop.run(_capacity(proxied, 64, args.requests * 2))
        sent += args.requests * 2 // 64 * 64
        print(
            f"\ncapacity, 64 clients without pause, instant upstream: direct {cap_direct:,.0f} "
            f"req/s, through the proxy {cap_proxy:,.0f} req/s ({cap_proxy / cap_direct:.2f}x)"
        )
        recorded, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline and recorded < sent:
            recorded = _count_events(tmp / "events")
            time.sleep(0.5)
        print(
            f"requests through the proxy: {sent}; completion events recorded: {recorded}; "
            f"lost: {sent - recorded}"
        )
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
