"""Time from asking for a sandbox to the first instruction of the command inside it, for the
container sandbox side by side with bubblewrap and a plain subprocess.

    .venv/bin/python -m bench.container_start [--runs 100]

Code paths, interleaved round-robin so load hits all alike: ``plain`` (``subprocess.run``),
``bubblewrap`` (``BubblewrapSandbox().run`` with a proxy endpoint: the forwarder starts first, as
for a harness) and ``container`` (``RuncSandbox().run`` over ``python:3.11-slim`` from the local
store, with a proxy endpoint: the overlay layer is mounted, the bundle written, runc creates the
namespaces and cgroup, the forwarder hook listens in the container's network, the command
starts). The command's first instruction writes the clock (``date +%s%N``); the latency is that
minus the clock just before the call. Proof of path: the command also reports its pid namespace
and the number of programs in ``/usr/bin`` (the image has far fewer than this machine).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

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

IMAGE = "localhost/python:3.11-slim"
COMMAND = "date +%s%N; readlink /proc/self/ns/pid; ls /usr/bin | wc -l"


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def _once(backend: SandboxBackend | None, spec: SandboxSpec) -> tuple[float, str, int]:
    start = time.time_ns()
    if backend is None:
        with open(spec.stdout, "wb") as out:
            subprocess.run(["sh", "-c", COMMAND], stdout=out, check=True)
    else:
        result = backend.run(spec)
        assert result.ok, (result, spec.stderr.read_text())
    first, ns, bins = spec.stdout.read_text().split()
    return (int(first) - start) / 1e6, ns, int(bins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    host_ns, host_bins = os.readlink("/proc/self/ns/pid"), len(os.listdir("/usr/bin"))
    root = ImageStore().rootfs(IMAGE)
    with tempfile.TemporaryDirectory(prefix="openforge-bench-start-") as tmp:
        t = Path(tmp)
        (t / "ws").mkdir()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(t / "proxy.sock"))
        listener.listen(8)
        proxy = ProxyEndpoint(t / "proxy.sock", 8100)
        base = dict(
            argv=("sh", "-c", COMMAND),
            stdout=t / "out.txt",
            stderr=t / "err.txt",
            cwd="/app",
            mounts=(Mount(t / "ws", "/app", read_only=False),),
            proxy=proxy,
        )
        paths: dict[str, tuple[SandboxBackend | None, SandboxSpec]] = {
            "plain": (None, SandboxSpec(**base)),  # type: ignore[arg-type]
            "bubblewrap": (BubblewrapSandbox(), SandboxSpec(**base)),  # type: ignore[arg-type]
            "container": (RuncSandbox(), SandboxSpec(**base, root=RootFs(root))),  # type: ignore[arg-type]
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.runs):
            for name, (backend, spec) in paths.items():
                ms, ns, bins = _once(backend, spec)
                assert (ns == host_ns) == (name == "plain"), (name, ns)
                assert (bins < host_bins // 2) == (name == "container"), (name, bins)
                times[name].append(ms)
    print(f"{args.runs} runs each, interleaved, {os.cpu_count()} cores; every run checked")
    print("| path | first instruction p50 ms | p90 ms | p99 ms |")
    print("|---|---|---|---|")
    for name, values in times.items():
        cells = " | ".join(f"{_pct(values, q):.1f}" for q in (0.5, 0.9, 0.99))
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
