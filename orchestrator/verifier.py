"""The local verifier run: a task's ``tests/test.sh`` in a fresh sandbox (a container of the
task's image, or bubblewrap) over a
workspace, with ``tests/`` at ``/tests`` read-only, ``/logs/verifier`` writable, the agent's logs
read-only, and no network at all.

One code path for both of its callers: the local rollout backend after the agent's run
(:mod:`orchestrator.local`), and ``openforge replay rescore`` over a saved final workspace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.sandbox import Limits, Mount, SandboxBackend, SandboxResult, SandboxSpec
from infra.tasks import Task, VerifierReward, read_reward
from orchestrator.workspace import Prepared

LOGS = "/logs"
TESTS = "/tests"
VERIFIER_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class VerifierRun:
    """How the verifier's sandbox ended and what reward its output holds."""

    result: SandboxResult
    reward: VerifierReward


def limits(task: Task, max_processes: int) -> Limits:
    return Limits(
        memory_mib=task.environment.memory_mb,
        max_processes=max_processes,
        cpus=float(task.environment.cpus) if task.environment.cpus else None,
    )


def run_verifier(
    sandbox: SandboxBackend, task: Task, root: Path, prepared: Prepared, max_processes: int = 512
) -> VerifierRun:
    """Run ``task``'s verifier over the attempt laid out at ``root`` (``prepared``); its output
    goes to ``root/verifier.out`` and ``verifier.err``, its reward files to
    ``prepared.dirs["verifier_logs"]``. Never raises for a bad verifier: the caller judges."""
    dirs, workdir = prepared.dirs, prepared.workdir
    result = sandbox.run(
        SandboxSpec(
            argv=("bash", f"{TESTS}/test.sh"),
            stdout=root / "verifier.out",
            stderr=root / "verifier.err",
            cwd=workdir,
            env={
                **prepared.env,
                "PATH": ":".join([*prepared.path_prefix, prepared.env.get("PATH", VERIFIER_PATH)]),
                "LANG": "C.UTF-8",
                **task.verifier.env,
            },
            root=prepared.root,
            mounts=(
                Mount(dirs["workspace"], workdir, read_only=False),
                Mount(task.tests_dir, TESTS, read_only=True),
                Mount(dirs["verifier_logs"], f"{LOGS}/verifier", read_only=False),
                Mount(dirs["agent_logs"], f"{LOGS}/agent", read_only=True),
                *prepared.mounts,
            ),
            limits=limits(task, max_processes),
            timeout_s=task.verifier.timeout_sec,
        )
    )
    return VerifierRun(result, read_reward(dirs["verifier_logs"]))
