"""The local rollout backend: each rollout in bubblewrap sandboxes on this machine.

Per attempt, under ``job.root`` (host)::

    workspace/        the task's files (its Dockerfile's COPY lines, or all of environment/),
                      then whatever the agent leaves; it appears at the Dockerfile's WORKDIR
                      or the task's workdir (e.g. /app) inside both sandboxes
    image/            COPY destinations outside the workspace, mounted at their paths
    home/             the harness's private home (its config, state); same path inside
    logs/agent/       /logs/agent inside the agent's sandbox (Harbor's layout)
    logs/verifier/    /logs/verifier inside the verifier's sandbox: reward.txt / reward.json
    agent.out, agent.err, verifier.out, verifier.err
    final-workspace.tar.gz, final-workspace.json   the workspace as the agent left it, saved
                      before the verifier runs (size-bounded; :mod:`orchestrator.final_workspace`)

The agent's sandbox sees the workspace, its home, its harness install (read-only), and the
proxy through the sandbox's forwarder (``http://127.0.0.1:PORT`` inside; a harness that declares
no network gets none at all): nothing of the tests, the solution (except for a harness that
declares it runs it, the ``oracle``), other rollouts, the repository or the cache. The
verifier runs afterwards in a fresh sandbox over the same workspace with ``tests/`` at
``/tests`` read-only and no network at all (:mod:`orchestrator.verifier`, the code path
``openforge replay rescore`` runs too).

Behind a proxy pool (``openforge proxy --workers N --uds PATH``) each worker listens on its own
Unix socket (``PATH``'s stem + ``-w<i>``), and the registration answer names the one that owns
the rollout (``job.proxy_socket``). That socket, not the front's, is the one bind-mounted into
the agent's sandbox, behind the same in-sandbox port: the forwarder relays straight to the
worker, so the rollout's calls take no extra hop through the front, and the agent can reach
nothing but that one worker (not the front, not the other workers, not the network). The
socket file stays the same across a restart of the worker (:mod:`proxy.pool`), so a running
sandbox's bind mount keeps working.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from infra.harnesses import Harness, Network
from infra.harnesses.base import Endpoint, Invocation, RolloutDirs
from infra.images import ImagePolicy
from infra.sandbox import (
    BubblewrapSandbox,
    Mount,
    ProxyEndpoint,
    SandboxBackend,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.warm_member import Member, Shape
from infra.sandbox.warm_pool import WarmPool
from infra.tasks import Task, VerifierReward, harbor
from orchestrator import final_workspace, sandbox_faults
from orchestrator.backend import (
    AgentEnd,
    RolloutBackend,
    RolloutBackendName,
    RunProxy,
    Verified,
    require_solution,
)
from orchestrator.backend import RolloutJob as Job
from orchestrator.costs import CostMeter
from orchestrator.environments import Environments, SandboxMode
from orchestrator.steps import Phase, combine, phases
from orchestrator.verifier import LOGS, VERIFIER_PATH, agent_artifacts, limits, run_verifier
from orchestrator.workspace import Prepared
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError, InfrastructureError, SandboxError, SetupError

SOLUTION = "/solution"
OUTPUT_TAIL = 4000  # characters of the verifier's output kept with its reward

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalConfig:
    """The local backend's section (``openforge rollouts run --allow-internet-tasks``,
    ``--max-workspace-mb``).

    Attributes:
        bwrap: the bubblewrap binary (None: ``$OPENFORGE_BWRAP``, else the installed one).
        sandbox: where tasks with an image run (:class:`~orchestrator.environments.SandboxMode`).
        images: how base images are found (stand-ins, strict, pull).
        max_processes: processes and threads per sandbox at most.
        allow_internet_tasks: run ``allow_internet`` tasks anyway, without internet.
        max_workspace_bytes: a final workspace up to this size is saved (for re-scoring).
        warm_pool: warm sandboxes kept ready per (image, harness), started ahead of the
            rollouts with the harness's runtime loaded (:mod:`infra.sandbox.warm_pool`); 0: off.
        warm_dir: where the members' directories live (None: a temporary directory); on the
            attempts' filesystem, a member's files move in and out by rename.
    """

    bwrap: Path | None = None
    max_processes: int = 512
    allow_internet_tasks: bool = False
    max_workspace_bytes: int = final_workspace.DEFAULT_LIMIT_BYTES
    sandbox: SandboxMode = SandboxMode.AUTO
    images: ImagePolicy = field(default_factory=ImagePolicy)
    warm_pool: int = 0
    warm_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sandbox", SandboxMode(self.sandbox))
        if self.warm_pool < 0:
            raise ConfigError(f"warm_pool={self.warm_pool}: give 0 (off) or members per image")


class LocalBackend(RolloutBackend):
    """Rollouts in ``sandbox`` (bubblewrap) on this machine, reaching the proxy at ``proxy``."""

    name = RolloutBackendName.LOCAL
    sandbox_faults = True

    def __init__(
        self,
        sandbox: SandboxBackend,
        proxy: ProxyEndpoint,
        max_processes: int = 512,
        allow_internet_tasks: bool = False,
        max_workspace_bytes: int = final_workspace.DEFAULT_LIMIT_BYTES,
        sandbox_mode: SandboxMode = SandboxMode.AUTO,
        images: ImagePolicy | None = None,
        warm_pool: int = 0,
        warm_dir: Path | None = None,
    ) -> None:
        self.environments = Environments(sandbox, sandbox_mode, images)
        self.pool = WarmPool(warm_pool, root=warm_dir) if warm_pool > 0 else None
        self.proxy = proxy
        self.max_processes = max_processes
        self.allow_internet_tasks = allow_internet_tasks
        self.max_workspace_bytes = max_workspace_bytes
        self._cancelled = threading.Event()

    @classmethod
    def from_config(cls, config: LocalConfig, proxy: RunProxy) -> LocalBackend:
        """Sandboxes reach the proxy through its Unix socket only: ConfigError without one."""
        if proxy.socket is None:
            raise ConfigError(
                f"the local backend's sandboxes reach the proxy through its Unix socket, and the "
                f"proxy at {proxy.url} has none here: give its --uds path (--proxy-socket)"
            )
        return cls(
            BubblewrapSandbox(bwrap=config.bwrap),
            proxy.socket,
            max_processes=config.max_processes,
            allow_internet_tasks=config.allow_internet_tasks,
            max_workspace_bytes=config.max_workspace_bytes,
            sandbox_mode=config.sandbox,
            images=config.images,
            warm_pool=config.warm_pool,
            warm_dir=config.warm_dir,
        )

    def preflight(self, harness: Harness) -> None:
        """The sandbox's tools (bubblewrap, the limits), and the harness's install."""
        self.environments.preflight()
        harness.executable()
        harness.read_only_paths()

    def check(self, task: Task, harness: Harness) -> list[str]:
        require_solution(task, harness)
        said = []
        if (note := harbor.network_note(task)) is not None:
            said.append(note)
        if harbor.network_public(task):  # allow_internet = true
            if not self.allow_internet_tasks:
                raise ConfigError(
                    f"task {task.id} ({task.config_file}) sets allow_internet = true, but a local "
                    "sandbox reaches only the proxy: run it with --backend kubernetes, or pass "
                    "--allow-internet-tasks to run it without internet anyway"
                )
            said.append(f"{task.id}: allow_internet = true, run without internet (opted in)")
        # The task's image is built here, before any start; a refused one raises.
        return said + self.environments.check(task, say=log.info)

    def runs_in(self, task: Task) -> str:
        return "container" if self.environments.uses_image(task) else "bubblewrap"

    def run(self, job: Job, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        try:
            return self._run(job, on_agent_end)
        except SandboxError as exc:  # set-up or clean-up of one sandbox: a new one may work
            raise InfrastructureError(f"the sandbox failed: {exc}") from exc

    def _run(self, job: Job, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        task = job.task
        if self._cancelled.is_set():
            raise InfrastructureError("cancelled")
        meter = CostMeter()
        try:
            with meter.time("prepare_s"):
                prepared = self.environments.prepare(task, job.root)
                planned = phases(task, job.root)
        # SetupError: building the task's pip environment failed (its index may be back later).
        except (OSError, SetupError) as exc:
            raise InfrastructureError(f"cannot lay out the workspace: {exc}") from exc
        ends: list[AgentEnd] = []
        rewards: list[tuple[str, VerifierReward]] = []
        verifier: SandboxResult | None = None
        saved, duration = None, 0.0
        for i, phase in enumerate(planned):
            last = i == len(planned) - 1
            ends.append(self._run_agent(job, prepared, phase, meter))
            if last:
                on_agent_end(AgentEnd.of_all(ends))
            if self._cancelled.is_set():
                raise InfrastructureError("cancelled")
            if last:  # the workspace as the agent left it, before the verifier writes into it
                with meter.time("save_s"):
                    saved = self._save_workspace(job, prepared)
            verifier, reward = self._verify(job, prepared, phase)
            meter.sandbox("verifier", verifier)
            rewards.append((phase.name, reward))
            duration += verifier.duration_s
            if (
                not last
                and phase.min_reward is not None
                and (reward.reward or 0) < phase.min_reward
            ):
                on_agent_end(AgentEnd.of_all(ends))  # below the step's min_reward: the rollout ends
                break
        assert verifier is not None
        reward = combine(task, rewards)
        names = [f"{p.agent_out}.{x}" for p in planned[: len(ends)] for x in ("out", "err")]
        names += [f"{p.verifier.name}.{x}" for p in planned[: len(rewards)] for x in ("out", "err")]
        files = {name: job.root / name for name in names}
        if saved is not None and saved.archive is not None:
            files[final_workspace.ARCHIVE] = saved.archive
        output = _tail(job.root / f"{planned[len(rewards) - 1].verifier.name}.out", OUTPUT_TAIL)
        end = AgentEnd.of_all(ends)
        return Verified(end, reward, verifier.exit_code, duration, files, output, meter.costs)

    def _save_workspace(self, job: Job, prepared: Prepared) -> final_workspace.SavedWorkspace:
        saved = final_workspace.save_or_note(
            prepared.dirs["workspace"], job.root, prepared.workdir, self.max_workspace_bytes
        )
        if saved.reason is not None:
            log.warning("rollout %s: %s", job.rollout_id, saved.reason)
        return saved

    def _verify(
        self, job: Job, prepared: Prepared, phase: Phase
    ) -> tuple[SandboxResult, VerifierReward]:
        """One verifier phase, in the agent's environment or its own; InfrastructureError when
        it did not finish or gave no reward."""
        own = self.environments.prepare_verifier(
            job.task, job.root / f"{phase.verifier.name}-env", phase.step
        )
        collected = prepared.dirs["artifacts"]
        artifacts = tuple(
            (collected / a.destination, a.source)
            for a in phase.artifacts
            if (collected / a.destination).exists()
        )
        verifier_phase = dataclasses.replace(phase.verifier, own=own, artifacts=artifacts)
        sandbox = self.environments.sandbox(own or prepared)
        run = run_verifier(
            sandbox, job.task, job.root, prepared, self.max_processes, verifier_phase
        )
        verifier, reward = run.result, run.reward
        if verifier.outcome is not SandboxOutcome.EXITED:
            raise InfrastructureError(f"the verifier did not finish: {verifier.message}")
        if reward.reward is None:
            raise InfrastructureError(
                f"the verifier (exit code {verifier.exit_code}) gave no reward: {reward.error}"
            )
        return verifier, reward

    def _run_agent(self, job: Job, prepared: Prepared, phase: Phase, meter: CostMeter) -> AgentEnd:
        """One agent phase: in a warm member of the pool when one is ready, else a cold sandbox.
        The harness writes its config into the home its sandbox has (the member's, at the
        member's path), named by the same path inside."""
        harness, dirs = job.harness, prepared.dirs
        sandbox = self.environments.sandbox(prepared)
        # A faulted rollout runs cold: its fault's files are laid out in its own home.
        member = None if job.fault else self._claim(job, prepared, phase, sandbox)
        home = member.home if member is not None else dirs["home"]
        proxy = self.endpoint_for(job)
        endpoint = Endpoint(proxy.base_url, job.rollout_id, job.api_key, job.model)
        inv = harness.invocation(
            phase.instruction,
            endpoint,
            RolloutDirs(home, Path(prepared.workdir)),
            phase.agent_timeout_s,
        )
        if job.fault is not None:
            fault_env = sandbox_faults.lay_out(job.fault, home)
            inv = dataclasses.replace(inv, env={**inv.env, **fault_env})
        spec = self._agent_spec(job, prepared, phase, home, inv)
        # A member's files go back to the attempt's directories once it ends.
        result = sandbox.run(spec) if member is None else member.run(spec, job.root, dirs["home"])
        meter.sandbox("agent", result)
        meter.add("agent_warm", 0.0 if member is None else 1.0)
        end = _agent_end(result, harness, spec.stdout, phase.agent_timeout_s)
        if job.fault is None:
            return end
        return dataclasses.replace(end, faults=sandbox_faults.fired(job.fault, home))

    def _claim(
        self, job: Job, prepared: Prepared, phase: Phase, sandbox: SandboxBackend
    ) -> Member | None:
        """A ready warm member for this phase's sandbox (None: no pool, a harness with nothing
        to preload, an image with an ENTRYPOINT, or none ready: it runs cold)."""
        preload = job.harness.preload()
        if self.pool is None or preload is None or prepared.entrypoint:
            return None
        draft = Invocation(["true"], {}, Path(prepared.workdir))
        spec = self._agent_spec(job, prepared, phase, prepared.dirs["home"], draft)
        shape = Shape.of(spec, job.root, sandbox, preload.python, preload.modules)
        return None if shape is None else self.pool.claim(shape)

    def _agent_spec(
        self, job: Job, prepared: Prepared, phase: Phase, home: Path, inv: Invocation
    ) -> SandboxSpec:
        task, harness = job.task, job.harness
        dirs, workdir = prepared.dirs, prepared.workdir
        mounts = [
            Mount(dirs["workspace"], workdir, read_only=False),
            Mount(home, str(home), read_only=False),
            Mount(dirs["agent_logs"], f"{LOGS}/agent", read_only=False),
            Mount(agent_artifacts(prepared), f"{LOGS}/artifacts", read_only=False),
            *(Mount(p, str(p), read_only=True) for p in harness.read_only_paths()),
            *prepared.mounts,
        ]
        if harness.capabilities.runs_solution and phase.solution is not None:
            mounts.append(Mount(phase.solution, SOLUTION, read_only=True))
        env = {**prepared.env, **inv.env}
        if prepared.root is not None:  # the harness's own directories, then the image's PATH
            bins = [str(d) for d in harness.bin_dirs()]
            env["PATH"] = ":".join([*bins, prepared.env.get("PATH", VERIFIER_PATH)])
        env["PATH"] = ":".join([*prepared.path_prefix, env.get("PATH", VERIFIER_PATH)])
        proxy = self.endpoint_for(job)
        return SandboxSpec(
            argv=(*prepared.entrypoint, *inv.argv),
            stdout=job.root / f"{phase.agent_out}.out",
            stderr=job.root / f"{phase.agent_out}.err",
            cwd=workdir,
            env=env,
            mounts=tuple(mounts),
            # A harness that declares no network (oracle, noop) gets none at all.
            proxy=proxy if harness.capabilities.network is Network.PROXY else None,
            limits=limits(task, self.max_processes),
            timeout_s=phase.agent_timeout_s,
            home=str(home),
            root=prepared.root,
            collect=tuple(
                (a.source, dirs["artifacts"] / a.destination, a.exclude) for a in phase.artifacts
            ),
            cancelled=self._cancelled,  # also one still starting when cancel() came
        )

    def endpoint_for(self, job: Job) -> ProxyEndpoint:
        """The proxy as ``job``'s sandbox sees it: its own worker's Unix socket behind a proxy
        pool (same port inside), else the backend's proxy socket."""
        if job.proxy_socket is None:
            return self.proxy
        return ProxyEndpoint(job.proxy_socket, self.proxy.port)

    def cancel(self) -> None:
        self._cancelled.set()
        self.environments.cancel()
        if self.pool is not None:
            self.pool.close()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _agent_end(result: SandboxResult, harness: Harness, stdout: Path, timeout: float) -> AgentEnd:
    if result.outcome is SandboxOutcome.FAILED_TO_START:
        raise InfrastructureError(f"the agent's sandbox did not start: {result.message}")
    report = harness.report(stdout.read_text(errors="replace")) if stdout.exists() else None
    final = report.final_message if report else None
    session = report.session_id if report else None
    if result.outcome is SandboxOutcome.TIMED_OUT:
        return AgentEnd(
            RolloutPhase.TIMED_OUT, None, result.duration_s, f"killed after {timeout:.0f}s"
        )
    phase = RolloutPhase.FINISHED if result.ok else RolloutPhase.FAILED
    message = result.message or f"exit code {result.exit_code}"
    if result.outcome is not SandboxOutcome.EXITED:  # a limit struck: the agent's doing
        message = f"{result.outcome.value}: {message}"
    return AgentEnd(phase, result.exit_code, result.duration_s, message, final, session)


def _tail(path: Path, limit: int) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return text[-limit:] or None
