"""The local verifier run: a task's ``tests/test.sh`` in a fresh sandbox, with its tests at
``/tests`` read-only, ``/logs/verifier`` writable, the agent's logs and artifacts
(``/logs/agent``, ``/logs/artifacts``) read-only, and no network at all.

Where it runs (Harbor's ``[verifier] environment_mode``, :mod:`infra.tasks.harbor`):
``shared``, in a fresh sandbox of the agent's environment (a container of the task's image, or
bubblewrap) over the agent's final workspace; ``separate``, in a container of the verifier's own
image over that image's own ``WORKDIR`` (``own``), seeing the agent's artifacts and not its
workspace.

One code path for both of its callers: the local rollout backend after the agent's run
(:mod:`orchestrator.local`), and ``openforge replay rescore`` over a saved final workspace.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class VerifierPhase:
    """One verifier run: its tests, deadline and variables, where its output goes (``name``:
    ``verifier`` -> ``verifier.out``, ``verifier.err``; ``logs``: its ``/logs/verifier``), and
    with a separate environment that environment (``own``)."""

    tests: Path
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "verifier"
    logs: Path | None = None  # None: the attempt's logs/verifier
    own: Prepared | None = None
    artifacts: tuple[tuple[Path, str], ...] = ()  # (collected copy, its source path inside)


def limits(task: Task, max_processes: int) -> Limits:
    return Limits(
        memory_mib=task.environment.memory_mb,
        max_processes=max_processes,
        cpus=float(task.environment.cpus) if task.environment.cpus else None,
    )


def agent_artifacts(prepared: Prepared) -> Path:
    """The host directory behind the agent's ``/logs/artifacts`` (Harbor's convention dir,
    kept where Harbor keeps it: ``artifacts/logs/artifacts``)."""
    path = prepared.dirs["artifacts"] / "logs" / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_phase(task: Task) -> VerifierPhase:
    return VerifierPhase(task.tests_dir, task.verifier.timeout_sec, task.verifier.env)


def _spec(task: Task, root: Path, agent: Prepared, phase: VerifierPhase, procs: int) -> SandboxSpec:
    where = phase.own or agent
    logs = phase.logs or agent.dirs["verifier_logs"]
    mounts = [
        Mount(phase.tests, TESTS, read_only=True),
        Mount(logs, f"{LOGS}/verifier", read_only=False),
        Mount(agent.dirs["agent_logs"], f"{LOGS}/agent", read_only=True),
        Mount(agent_artifacts(agent), f"{LOGS}/artifacts", read_only=True),
    ]
    # Shared: the agent's workspace and what the host sandbox adds for it; separate: the
    # verifier image's own WORKDIR, fresh. Then each collected artifact at its own path, as
    # Harbor re-materializes them.
    mounts.insert(0, Mount(where.dirs["workspace"], where.workdir, read_only=False))
    mounts += where.mounts
    mounts += [Mount(host, inside, read_only=False) for host, inside in phase.artifacts]
    return SandboxSpec(
        argv=(*where.entrypoint, "bash", f"{TESTS}/test.sh"),
        stdout=root / f"{phase.name}.out",
        stderr=root / f"{phase.name}.err",
        cwd=where.workdir,
        env={
            **where.env,
            "PATH": ":".join([*where.path_prefix, where.env.get("PATH", VERIFIER_PATH)]),
            "LANG": "C.UTF-8",
            **phase.env,
        },
        mounts=tuple(mounts),
        limits=limits(task, procs),
        timeout_s=phase.timeout_s,
        root=where.root,
    )


def run_verifier(
    sandbox: SandboxBackend,
    task: Task,
    root: Path,
    prepared: Prepared,
    max_processes: int = 512,
    phase: VerifierPhase | None = None,
) -> VerifierRun:
    """Run ``task``'s verifier (``phase``: the task's own by default) over the attempt laid out
    at ``root`` (``prepared``); its output goes to ``root/verifier.out`` and ``verifier.err``,
    its reward files to ``prepared.dirs["verifier_logs"]``. ``sandbox`` is the one for the
    environment it runs in. Never raises for a bad verifier: the caller judges."""
    phase = phase or default_phase(task)
    logs = phase.logs or prepared.dirs["verifier_logs"]
    logs.mkdir(parents=True, exist_ok=True)
    owner = (phase.own or prepared).root
    if owner is not None and owner.uid != 0:  # the image's user writes its reward there
        os.chown(logs, owner.uid, owner.gid)
    result = sandbox.run(_spec(task, root, prepared, phase, max_processes))
    return VerifierRun(result, read_reward(logs))
