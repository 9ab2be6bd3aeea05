"""What the orchestrator and the sandbox add per rollout, side by side with plain subprocesses.

    .venv/bin/python -m bench.rollout_overhead [--rollouts 200] [--concurrency 8]

Code paths measured, one after another in one run: ``orchestrator.run.Orchestrator`` on
``orchestrator.local.LocalBackend`` with the real proxy (in this process, on its Unix socket),
once with ``--sandbox bubblewrap`` (``infra.sandbox.BubblewrapSandbox``, the task's Dockerfile
subset on this machine's root filesystem) and once with the default ``--sandbox auto`` (the
task's image, built once with buildah, each sandbox a runc container: ``infra.sandbox.runc``);
per rollout, the proxy registers it and mints its key, the workspace is laid out, the
oracle runs the task's ``solve.sh`` in a sandbox (with the proxy forwarder), the verifier runs
``test.sh`` in a fresh sandbox, and the lifecycle events and the reward are recorded through the
proxy. The baseline runs the same two scripts as plain subprocesses in a copied workspace, at
the same concurrency. Proof of path: ``solve.sh`` writes the pid and network namespace it ran
in and the number of programs in ``/usr/bin``; every sandboxed rollout must report namespaces
other than this process's, every plain one the same as this process's, and every container
rollout the image's ``/usr/bin`` (far fewer programs than this machine's).

Per-phase breakdown (wall ms per rollout, mean): each named function below is timed where the
rollout calls it (wrapped for this process only; behaviour unchanged), and ``rest`` is the
rollout's wall time minus all of them (the orchestrator's own work and waiting for a thread or
a core): the proxy's admin calls (register, two lifecycle events, finish, reward), the
workspace's lay-out, the final workspace's save, and each sandbox run (``runc run`` itself, the
layer's mount, the clean-up; bubblewrap's run whole).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.harnesses import Oracle
from infra.paths import default_tiny_dir
from infra.proxy_client import Phase, ProxyAdmin, Reward
from infra.sandbox import BubblewrapSandbox, ProxyEndpoint, RuncSandbox
from infra.tasks import load_task
from infra.tiny_model import build_tiny_model
from openforge.testing.proxy import proxy_config, running_proxy
from orchestrator import final_workspace
from orchestrator.environments import Environments, SandboxMode
from orchestrator.local import LocalBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status
from schemas.enums import RolloutPhase

SOLVE = (
    "readlink /proc/self/ns/pid /proc/self/ns/net > ns.txt\nls /usr/bin | wc -l >> ns.txt\n"
    "echo done > out.txt\n"
)
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY README /app/\n"
VERIFY = (
    'mkdir -p "${LOGS:-/logs}/verifier"\n'
    'if [ -f out.txt ]; then r=1; else r=0; fi\necho "$r" > "${LOGS:-/logs}/verifier/reward.txt"\n'
)


def _task(root: Path) -> Path:
    for d in ("tests", "solution", "environment"):
        (root / d).mkdir(parents=True)
    (root / "instruction.md").write_text("Write out.txt.\n")
    (root / "task.toml").write_text('version = "1.0"\n[environment]\nworkdir = "/app"\n')
    (root / "environment" / "README").write_text("a trivial task\n")
    (root / "solution" / "solve.sh").write_text(SOLVE)
    (root / "tests" / "test.sh").write_text(VERIFY)
    (root / "environment" / "Dockerfile").write_text(DOCKERFILE)
    return root


def _plain(task: Path, root: Path) -> tuple[float, str]:
    start = time.perf_counter()
    work, logs = root / "workspace", root / "logs"
    shutil.copytree(task / "environment", work)
    (logs / "verifier").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "LOGS": str(logs)}
    subprocess.run(["bash", str(task / "solution" / "solve.sh")], cwd=work, env=env, check=True)
    subprocess.run(["bash", str(task / "tests" / "test.sh")], cwd=work, env=env, check=True)
    assert (logs / "verifier" / "reward.txt").read_text().strip() == "1"
    return time.perf_counter() - start, (work / "ns.txt").read_text()


# Each phase's label and the functions timed for it (several: their times add up).
PHASES: dict[str, tuple[tuple[object, str], ...]] = {
    "proxy admin calls": tuple(
        (ProxyAdmin, name)
        for name in (
            "register_rollout",
            "record_phase",
            "record_phases",
            "finish_rollout",
            "post_reward",
        )
    ),
    "lay-out": ((Environments, "prepare"),),
    "final workspace saved": ((final_workspace, "save_or_note"),),
    "bubblewrap runs": ((BubblewrapSandbox, "run"),),
    "container runs": ((RuncSandbox, "run"),),
    "runc run": ((RuncSandbox, "_run_container"),),
    "layer mounted": ((RuncSandbox, "_mount_layer"),),
    "container removed": ((RuncSandbox, "_remove_stopped"),),
    "clean-up": ((RuncSandbox, "_tear_down"),),
}
RUNC_PARTS = ("runc run", "layer mounted", "container removed", "clean-up")


class PhaseClock:
    """Wall time spent in each of :data:`PHASES` (summed over threads), by wrapping them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        for label, functions in PHASES.items():
            for owner, name in functions:
                self._wrap(owner, name, label)

    def _wrap(self, owner: object, name: str, label: str) -> None:
        raw = vars(owner)[name]
        func = raw.__func__ if isinstance(raw, staticmethod) else raw

        @functools.wraps(func)
        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[label] += time.perf_counter() - start

        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)

    def take(self) -> dict[str, float]:
        with self._lock:
            out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


@dataclass
class Row:
    name: str
    walls: list[float]
    agent: list[float]
    verifier: list[float]
    wall: float
    phases: dict[str, float] = field(default_factory=dict)


def _checked(
    records: list[RolloutOutcome],
    n: int,
    run: Path,
    host_ns: str,
    host_bins: int,
    mode: SandboxMode,
) -> list[RolloutOutcome]:
    """The verified rollouts, each proven to have taken the path: own namespaces, and in a
    container the image's /usr/bin."""
    ok = [r for r in records if r.status is Status.VERIFIED and r.reward == 1.0]
    assert len(ok) == n, [r.message for r in records if r not in ok][:3]
    for r in ok:
        pid_ns, net_ns, bins = (
            (run / "rollouts" / r.rollout_id / "workspace" / "ns.txt").read_text().split()
        )
        assert pid_ns not in host_ns and net_ns not in host_ns, r.rollout_id
        in_image = int(bins) < host_bins // 2
        assert in_image == (mode is SandboxMode.AUTO), (r.rollout_id, bins, host_bins)
    return ok


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    host_ns = Path("/proc/self/ns/pid").readlink().name + Path("/proc/self/ns/net").readlink().name
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-rollouts-"))
    task_dir = _task(tmp / "task")
    task = load_task(task_dir)
    model = build_tiny_model(default_tiny_dir(0), seed=0)

    # Baseline: the same scripts as plain subprocesses.
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        plain = list(
            pool.map(lambda i: _plain(task_dir, tmp / "plain" / str(i)), range(args.rollouts))
        )
    plain_wall = time.perf_counter() - t0
    assert all(ns.replace("\n", "").count(host_ns[:10]) for _, ns in plain)

    host_bins = len(os.listdir("/usr/bin"))
    config = proxy_config(
        "http://127.0.0.1:9",
        tmp / "proxy",
        tokenizer=model,
        upstream_model="tiny",
        max_model_len=4096,
    )
    plain_s = [s for s, _ in plain]
    rows = [Row("plain subprocesses (solve.sh + test.sh)", plain_s, [], [], plain_wall)]
    clock = PhaseClock()
    with running_proxy(config, unix_socket=tmp / "proxy" / "proxy.sock") as proxy:
        assert proxy.unix_socket is not None
        endpoint = ProxyEndpoint(proxy.unix_socket, 8100)
        for mode in (SandboxMode.BUBBLEWRAP, SandboxMode.AUTO):
            backend = LocalBackend(BubblewrapSandbox(), endpoint, sandbox_mode=mode)
            orch = Orchestrator(
                backend,
                Oracle(),
                proxy.admin,
                RunDir(tmp / f"run-{mode}"),
                OrchestratorConfig(concurrency=args.concurrency, max_attempts=1),
            )
            orch.check([task])  # the image is built (or found) before the clock starts
            clock.take()
            t0 = time.perf_counter()
            records = orch.run(plan([task], args.rollouts, run_id=f"bench-{mode}"))
            wall = time.perf_counter() - t0
            phases = clock.take()
            ok = _checked(records, args.rollouts, tmp / f"run-{mode}", host_ns, host_bins, mode)
            name = "runc containers of the image" if mode is SandboxMode.AUTO else "bubblewrap"
            rows.append(
                Row(
                    f"orchestrator + 2 {name} + proxy events",
                    [r.wall_s or 0.0 for r in ok],
                    [r.agent_s or 0.0 for r in ok],
                    [r.verifier_s or 0.0 for r in ok],
                    wall,
                    phases,
                )
            )
        admin_rows = _admin_side_by_side(proxy.admin, args.rollouts, args.concurrency)
    print(
        f"{args.rollouts} rollouts of a trivial task at concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores"
    )
    print("| path | p50 ms | p99 ms | rollouts/min | agent p50 | verifier p50 | rest p50 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        rate = args.rollouts / row.wall * 60
        cells = [f"{_pct(row.walls, 0.5):.1f}", f"{_pct(row.walls, 0.99):.1f}", f"{rate:,.0f}"]
        if row.agent:
            rest = [w - a - v for w, a, v in zip(row.walls, row.agent, row.verifier, strict=True)]
            cells += [f"{_pct(x, 0.5):.1f}" for x in (row.agent, row.verifier, rest)]
        else:
            cells += ["", "", ""]
        print(f"| {row.name} | " + " | ".join(cells) + " |")
    base, bubble, container = rows
    added = {r.name: _pct(r.walls, 0.5) - _pct(base.walls, 0.5) for r in (bubble, container)}
    print(
        f"containers vs bubblewrap, rollouts/min: {bubble.wall / container.wall:.2f}x; added "
        f"over plain at p50: bubblewrap {added[bubble.name]:.1f} ms, containers "
        f"{added[container.name]:.1f} ms; every rollout checked for its path"
    )
    _breakdown(args.rollouts, rows[1:])
    _print_admin(admin_rows, args.concurrency)
    shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class AdminRow:
    name: str
    requests: int
    walls: list[float]  # per rollout: its own admin calls
    cpu_s: float  # this process's CPU (the proxy's and the client's: both run here)
    rollouts: int


def _admin_side_by_side(admin: ProxyAdmin, n: int, concurrency: int) -> list[AdminRow]:
    """A run's admin traffic alone, side by side on the same proxy: one call per record
    (``queued``, registration, the agent's end, ``verified``, the reward: the orchestrator
    before issue 50, item 4) against the orchestrator's own calls now
    (:meth:`ProxyAdmin.record_phases` for the queue, then registration, the agent's end and
    ``verified`` carrying the reward). Proof of path: each request is counted where it is sent
    (``ProxyAdmin._call``)."""
    sent: list[str] = []
    raw_call = ProxyAdmin._call

    @functools.wraps(raw_call)
    def counted(self: ProxyAdmin, method: str, path: str, *a: Any, **k: Any) -> dict[str, Any]:
        sent.append(path)
        return raw_call(self, method, path, *a, **k)

    setattr(ProxyAdmin, "_call", counted)  # noqa: B010 (wrapped for this process only)
    try:  # A B B A: a drift in the machine's load weighs on both alike
        runs = [_admin_run(admin, n, concurrency, b, sent) for b in (False, True, True, False)]
    finally:
        setattr(ProxyAdmin, "_call", raw_call)  # noqa: B010
    return [_merged(runs[0], runs[3]), _merged(runs[1], runs[2])]


def _merged(a: AdminRow, b: AdminRow) -> AdminRow:
    return AdminRow(
        a.name, a.requests + b.requests, a.walls + b.walls, a.cpu_s + b.cpu_s,
        a.rollouts + b.rollouts,
    )  # fmt: skip


def _admin_run(
    admin: ProxyAdmin, n: int, concurrency: int, batched: bool, sent: list[str]
) -> AdminRow:
    run = f"admin-{'batched' if batched else 'percall'}-{time.monotonic_ns()}"
    ids = [f"{run}-{i}" for i in range(n)]
    costs = {"agent_s": 0.1, "verifier_s": 0.05, "wall_s": 0.2}
    sent.clear()
    cpu0, walls = time.process_time(), [0.0] * n
    queued = [Phase(r, RolloutPhase.QUEUED, task_id="t", group_id=run) for r in ids]
    t0 = time.perf_counter()
    if batched:
        admin.record_phases(queued)
    else:
        for q in queued:
            admin.record_phase(q.rollout_id, q.phase, task_id=q.task_id, group_id=q.group_id)
    queue_s = (time.perf_counter() - t0) / n  # each rollout's share

    def one(i: int) -> None:
        start, rollout_id = time.perf_counter(), ids[i]
        admin.register_rollout(rollout_id, task_id="t", group_id=run, harness="oracle")
        admin.finish_rollout(rollout_id, RolloutPhase.FINISHED, exit_code=0, backend="local")
        scored = Reward(1.0, {"tests": 1.0}, "t@1", "ok")
        if batched:
            admin.record_phase(rollout_id, RolloutPhase.VERIFIED, costs=costs, reward=scored)
        else:
            admin.record_phase(rollout_id, RolloutPhase.VERIFIED, costs=costs)
            admin.post_reward(rollout_id, 1.0, components={"tests": 1.0}, verifier="t@1",
                              verifier_output="ok")  # fmt: skip
        walls[i] = time.perf_counter() - start + queue_s

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(n)))
    name = "batched (now)" if batched else "one call per record (before)"
    return AdminRow(name, len(sent), walls, time.process_time() - cpu0, n)


def _print_admin(rows: list[AdminRow], concurrency: int) -> None:
    print(f"\nAdmin calls alone, side by side on the same proxy, concurrency {concurrency}:\n")
    print("| admin traffic | requests / rollout | p50 ms / rollout | p99 ms | CPU ms / rollout |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.name} | {r.requests / r.rollouts:.2f} | {_pct(r.walls, 0.5):.1f} | "
            f"{_pct(r.walls, 0.99):.1f} | {r.cpu_s / r.rollouts * 1000:.1f} |"
        )
    before, now = rows
    print(
        f"batched vs one call per record: CPU {now.cpu_s / before.cpu_s:.2f}x, p50 "
        f"{_pct(now.walls, 0.5) / _pct(before.walls, 0.5):.2f}x"
    )


def _breakdown(n: int, rows: list[Row]) -> None:
    """Wall ms per rollout in each phase, mean; ``rest``: the rollout's wall time outside them."""
    labels = list(PHASES)
    print("\nPer-phase breakdown, wall ms per rollout (mean):\n")
    print("| phase | " + " | ".join(r.name.split(" + ")[1] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for label in [*labels, "rest"]:
        cells = []
        for row in rows:
            if label == "rest":
                inside = sum(v for k, v in row.phases.items() if k not in RUNC_PARTS)
                value = sum(row.walls) - inside
            else:
                value = row.phases.get(label, 0.0)
            cells.append(f"{value / n * 1000:.1f}" if value else "")
        prefix = "  of which " if label in RUNC_PARTS else ""
        print(f"| {prefix}{label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
