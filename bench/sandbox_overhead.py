"""Start-up cost of the bubblewrap sandbox, measured side by side against a plain subprocess.

    .venv/bin/python -m bench.sandbox_overhead [--runs 200] [--command true]

Three paths run the same command, interleaved round-robin so that load on the machine hits all
three alike; each measurement is the wall time of one call, start to return:

- ``plain``: ``subprocess.Popen(command).wait()``, output to files, no isolation.
- ``sandbox``: ``BubblewrapSandbox().run(spec)`` (the full path: pre-check, cgroup groups created
  and removed, bwrap with all namespaces, the command, the wait for the namespace to die).
- ``sandbox+proxy``: the same with a proxy endpoint, so the forwarder (a Python process) starts
  first and the command runs under it; this is the path a harness run takes.

Each sandboxed measurement is checked, not assumed: bwrap reports the namespace inode numbers the
command ran in, and a measurement counts only if its pid and net namespaces differ from this
process's (``/proc/self/ns``). "added" is sandbox minus plain at each percentile.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from infra.sandbox import BubblewrapSandbox, Mount, ProxyEndpoint, SandboxSpec


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _host_ns(kind: str) -> int:
    return int(os.readlink(f"/proc/self/ns/{kind}").split("[")[1].rstrip("]"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--command", default="true", help="command (split on spaces) to run")
    args = parser.parse_args()
    command = tuple(args.command.split())
    backend = BubblewrapSandbox()
    host = {k: _host_ns(k) for k in ("pid", "net")}
    times: dict[str, list[float]] = {"plain": [], "sandbox": [], "sandbox+proxy": []}
    isolated = {"sandbox": 0, "sandbox+proxy": 0}
    with tempfile.TemporaryDirectory(prefix="openforge-bench-") as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the forwarder's target
        listener.bind(str(root / "proxy.sock"))
        listener.listen(8)
        out, err = root / "out.txt", root / "err.txt"
        base = SandboxSpec(
            argv=command,
            stdout=out,
            stderr=err,
            cwd="/app",
            mounts=(Mount(root / "ws", "/app", read_only=False),),
        )
        specs = {
            "sandbox": base,
            "sandbox+proxy": dataclasses.replace(
                base, proxy=ProxyEndpoint(root / "proxy.sock", 18080)
            ),
        }
        for name, spec in specs.items():  # warm-up: page cache, the bwrap probe, cgroup check
            for _ in range(5):
                assert backend.run(spec).ok, (name, err.read_text())
        for _ in range(args.runs):
            t0 = time.perf_counter()
            with open(out, "wb") as o, open(err, "wb") as e:
                code = subprocess.Popen(command, stdout=o, stderr=e).wait()
            times["plain"].append(time.perf_counter() - t0)
            assert code == 0
            for name, spec in specs.items():
                t0 = time.perf_counter()
                result = backend.run(spec)
                times[name].append(time.perf_counter() - t0)
                assert result.ok, (name, result, err.read_text())
                ns = result.namespaces
                if all(ns.get(k) not in (None, host[k]) for k in ("pid", "net")):
                    isolated[name] += 1
        # And once from inside, by the command itself: /proc/self/ns as the sandbox sees it.
        probe = dataclasses.replace(
            base, argv=("readlink", "/proc/self/ns/pid", "/proc/self/ns/net")
        )
        assert backend.run(probe).ok
        inside = out.read_text().split()
        listener.close()
    print(
        f"command {' '.join(command)!r}, {args.runs} runs per path, limits by {backend.limits_by}"
    )
    print(f"host pid ns {host['pid']}, net ns {host['net']}")
    print("| path | p50 ms | p99 ms | p50 added ms | p99 added ms | p50 ratio | new pid+net ns |")
    print("|---|---|---|---|---|---|---|")
    p50, p99 = _pct(times["plain"], 0.5) * 1e3, _pct(times["plain"], 0.99) * 1e3
    print(f"| plain | {p50:.1f} | {p99:.1f} | - | - | 1.0x | - |")
    for name in specs:
        s50, s99 = _pct(times[name], 0.5) * 1e3, _pct(times[name], 0.99) * 1e3
        print(
            f"| {name} | {s50:.1f} | {s99:.1f} | {s50 - p50:.1f} | {s99 - p99:.1f} | "
            f"{s50 / p50:.1f}x | {isolated[name]}/{args.runs} |"
        )
    print(f"inside (readlink /proc/self/ns/pid, net): {inside}")


if __name__ == "__main__":
    main()
