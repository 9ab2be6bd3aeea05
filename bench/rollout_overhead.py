"""What the orchestrator and the sandbox add per rollout, side by side with plain subprocesses.

    .venv/bin/python -m bench.rollout_overhead [--rollouts 200] [--concurrency 8]

Code path measured: ``orchestrator.run.Orchestrator`` on ``orchestrator.local.LocalBackend``
with ``infra.sandbox.BubblewrapSandbox`` and the real proxy (in this process, on its Unix
socket): per rollout, the proxy registers it and mints its key, the workspace is laid out, the
oracle runs the task's ``solve.sh`` in a sandbox (with the proxy forwarder), the verifier runs
``test.sh`` in a fresh sandbox, and the lifecycle events and the reward are recorded through the
proxy. The baseline runs the same two scripts as plain subprocesses in a copied workspace, at
the same concurrency. Proof of path: ``solve.sh`` writes the pid and network namespace it ran
in; every sandboxed rollout must report namespaces other than this process's, every plain one
the same as this process's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.harnesses import Oracle
from infra.paths import default_tiny_dir
from infra.sandbox import BubblewrapSandbox, ProxyEndpoint
from infra.tasks import load_task
from infra.tiny_model import build_tiny_model
from openforge.testing.proxy import proxy_config, running_proxy
from orchestrator.local import LocalBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status

SOLVE = "readlink /proc/self/ns/pid /proc/self/ns/net > ns.txt\necho done > out.txt\n"
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

    # Orchestrated and sandboxed.
    config = proxy_config(
        "http://127.0.0.1:9",
        tmp / "proxy",
        tokenizer=model,
        upstream_model="tiny",
        max_model_len=4096,
    )
    with running_proxy(config, unix_socket=tmp / "proxy" / "proxy.sock") as proxy:
        assert proxy.unix_socket is not None
        backend = LocalBackend(BubblewrapSandbox(), ProxyEndpoint(proxy.unix_socket, 8100))
        orch = Orchestrator(
            backend,
            Oracle(),
            proxy.admin,
            RunDir(tmp / "run"),
            OrchestratorConfig(concurrency=args.concurrency, max_attempts=1),
        )
        t0 = time.perf_counter()
        records = orch.run(plan([task], args.rollouts, run_id="bench"))
        sandboxed_wall = time.perf_counter() - t0
    ok = [r for r in records if r.status is Status.VERIFIED and r.reward == 1.0]
    assert len(ok) == args.rollouts, [r.message for r in records if r not in ok][:3]
    isolated = 0
    for r in ok:
        ns = (tmp / "run" / "rollouts" / r.rollout_id / "workspace" / "ns.txt").read_text()
        pid_ns, net_ns = ns.split()
        isolated += pid_ns not in host_ns and net_ns not in host_ns
    assert isolated == args.rollouts, f"only {isolated} rollouts ran in their own namespaces"

    plain_s = [s for s, _ in plain]
    walls = [r.wall_s or 0.0 for r in ok]
    print(
        f"{args.rollouts} rollouts of a trivial task at concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores"
    )
    print("| path | p50 ms per rollout | p99 ms | rollouts/min |")
    print("|---|---|---|---|")
    print(
        f"| plain subprocesses (solve.sh + test.sh) | {_pct(plain_s, 0.5):.1f} | "
        f"{_pct(plain_s, 0.99):.1f} | {args.rollouts / plain_wall * 60:,.0f} |"
    )
    print(
        f"| orchestrator + 2 sandboxes + proxy events | {_pct(walls, 0.5):.1f} | "
        f"{_pct(walls, 0.99):.1f} | {args.rollouts / sandboxed_wall * 60:,.0f} |"
    )
    print(
        f"added per rollout: p50 {_pct(walls, 0.5) - _pct(plain_s, 0.5):.1f} ms, p99 "
        f"{_pct(walls, 0.99) - _pct(plain_s, 0.99):.1f} ms; "
        f"{isolated}/{args.rollouts} sandboxed rollouts in their own pid+net namespaces"
    )
    agent = [r.agent_s or 0.0 for r in ok]
    verifier = [r.verifier_s or 0.0 for r in ok]
    print(
        f"inside: agent sandbox p50 {_pct(agent, 0.5):.1f} ms, verifier sandbox p50 "
        f"{_pct(verifier, 0.5):.1f} ms"
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
