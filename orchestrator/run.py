"""Orchestrate a batch of rollouts: keys, concurrency, events, retries, cancellation.

Per rollout (one attempt):

1. ``queued`` is recorded when it is planned (the run's rollouts in one request); it waits
   for one of ``concurrency`` slots.
2. The proxy registers it and mints its key (``started``): the key is all the agent gets.
   Behind a proxy pool the answer also names the worker that owns the rollout; the backend
   points the harness at that worker (its URL, or its Unix socket for a sandbox), so the
   rollout's calls skip the pool's front.
3. The backend lays out the workspace and runs the harness in its sandbox under the task's agent
   timeout; the agent's end (``finished`` / ``failed`` / ``timed_out``, exit code) is recorded
   with the proxy, which closes the rollout to further calls.
4. The backend runs the verifier in a fresh sandbox; ``verified`` and the RewardEvent (with the
   verifier's components) are recorded together, in one request and one write, with the admin
   credential, which only the orchestrator holds.

So a rollout costs three admin calls (registration, the agent's end, verified with its
reward) and its share of the run's one ``queued`` request.

Errors are told apart once, by what another attempt could change:

- an infrastructure failure (:class:`~schemas.errors.InfrastructureError`: the sandbox did not
  start, the verifier crashed or wrote no reward; or the proxy could not register the rollout or
  failed mid-rollout) is recorded as ``infra_failed`` and retried as a new attempt, a new rollout
  id (``-a2``, ``-a3``), with exponential backoff, up to ``max_attempts``; each is counted;
- any other error of ours, a set-up or config error above all (:class:`~schemas.errors.SetupError`
  or :class:`~schemas.errors.ConfigError`: a missing tool, a harness that is not installed, a
  task the backend cannot lay out), would fail every attempt of every rollout:
  :meth:`Orchestrator.check` raises it before the first rollout where it can be seen; met during
  a rollout, it is recorded on that attempt (``infra_failed``), the other rollouts are cancelled
  and the run raises it, once;
- an agent failure is the agent's result and is never retried.

Ctrl-C or SIGTERM (:meth:`Orchestrator.cancel`) stops new starts, kills every running sandbox and
returns what finished.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from infra.harnesses import Harness
from infra.proxy_client import Finished, Phase, ProxyAdmin, Reward
from infra.tasks import Task
from orchestrator.backend import AgentEnd, RolloutBackend, RolloutJob, Verified
from orchestrator.costs import CostMeter
from orchestrator.plan import PlannedRollout
from orchestrator.progress import Counts
from orchestrator.rundir import RolloutOutcome, RunDir
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError, InfrastructureError, OpenForgeError, ServiceError
from schemas.faults import SANDBOX_FAULT, SANDBOX_FAULTS, FaultPlan, SandboxFault
from schemas.rollout import RETRIED


@dataclass(frozen=True)
class OrchestratorConfig:
    """Attributes:
    concurrency: rollouts running at once.
    max_attempts: attempts per rollout when infrastructure fails (1: no retry).
    backoff_s: the first retry's delay; doubled for each further attempt.
    model: the model name harnesses ask the proxy for.
    faults: the run's fault plan; the orchestrator draws each rollout's sandbox fault from it
        (the proxy injects the call faults). None: none.
    """

    concurrency: int = 4
    max_attempts: int = 3
    backoff_s: float = 1.0
    model: str = "tiny"
    faults: FaultPlan | None = None


class Orchestrator:
    """Runs planned rollouts of ``harness`` on ``backend`` through the proxy ``admin``."""

    def __init__(
        self,
        backend: RolloutBackend,
        harness: Harness,
        admin: ProxyAdmin,
        run_dir: RunDir,
        config: OrchestratorConfig = OrchestratorConfig(),
        on_change: Callable[[Counts], None] | None = None,
    ) -> None:
        self.backend, self.harness, self.admin = backend, harness, admin
        self.run_dir, self.config = run_dir, config
        self.counts = Counts()
        self._on_change = on_change or (lambda counts: None)
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._preflight_passed = False
        self._checked: set[str] = set()  # task ids the backend accepted
        self._stopped: list[RolloutOutcome] = []  # this run's rollouts a set-up error ended
        self._queued_at = time.monotonic()  # when the rollouts of the current run() were queued

    def _update(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.counts, name, getattr(self.counts, name) + delta)
        self._on_change(self.counts)

    def cancel(self) -> None:
        """Start no more rollouts and stop the running ones (from any thread)."""
        self._cancelled.set()
        self.backend.cancel()

    def check(self, tasks: Sequence[Task]) -> list[str]:
        """Before anything starts: the backend's preflight for the harness (SetupError or
        ConfigError, saying the fix), then each of ``tasks`` the backend has not accepted yet
        (ConfigError, saying where it can run). Returns the backend's notes for the run's log
        (how each task's environment is provided). :meth:`run` calls it too."""
        if not self._preflight_passed:
            self.backend.check_faults(self.config.faults)
            self.backend.preflight(self.harness)
            self._preflight_passed = True
        notes: list[str] = []
        for task in tasks:
            if task.id not in self._checked:  # each task once, also across check() and run()
                notes += self.backend.check(task, self.harness)
                self._checked.add(task.id)
        return notes

    def run(self, planned: Sequence[PlannedRollout]) -> list[RolloutOutcome]:
        """Run every planned rollout; returns one outcome per rollout (its last attempt). Raises
        a set-up or config error once, the first that a rollout met, after stopping the rest."""
        self.check([p.task for p in planned])
        self._stopped.clear()
        self._update(planned=len(planned), queued=len(planned))
        self._queued_at = time.monotonic()
        self.admin.record_phases([self._queued(p, p.rollout_id(1)) for p in planned])
        outcomes: list[RolloutOutcome] = []
        pending = list(planned)
        with ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="rollout") as pool:
            running: set[Future[RolloutOutcome]] = set()
            try:
                while pending or running:
                    while pending and len(running) < self.config.concurrency:
                        if self._cancelled.is_set():
                            break
                        running.add(pool.submit(self._rollout, pending.pop(0)))
                    if not running:
                        break
                    done, running = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        outcomes.append(future.result())
            except BaseException:  # Ctrl-C / SIGTERM, or an error no attempt passes: stop all
                self.cancel()
                for future in running:
                    with contextlib.suppress(Exception):  # each one's outcome says how it ended
                        outcomes.append(future.result(timeout=60))
                raise
            finally:
                for p in pending:
                    self._update(queued=-1, cancelled=1)
                    outcomes.append(RolloutOutcome.cancelled(p, p.rollout_id(1)))
                self.run_dir.write_summary([*outcomes, *self._stopped])
        return outcomes

    def _phase(
        self,
        p: PlannedRollout,
        rollout_id: str,
        phase: RolloutPhase,
        message: str | None = None,
        costs: dict[str, float] | None = None,
        metadata: dict[str, str] | None = None,
        reward: Reward | None = None,
    ) -> None:
        self.admin.record_phase(
            rollout_id,
            phase,
            message=message,
            task_id=p.task.id,
            group_id=p.group_id,
            harness=self.harness.name,
            backend=self.backend.name,
            costs=costs,
            metadata=metadata,
            reward=reward,
        )

    def _queued(self, p: PlannedRollout, rollout_id: str) -> Phase:
        return Phase(
            rollout_id,
            RolloutPhase.QUEUED,
            task_id=p.task.id,
            group_id=p.group_id,
            harness=self.harness.name,
            backend=self.backend.name,
        )

    def _rollout(self, p: PlannedRollout) -> RolloutOutcome:
        self._update(queued=-1, running=1)
        queued = self._queued_at
        try:
            for attempt in range(1, self.config.max_attempts + 1):
                rollout_id = p.rollout_id(attempt)
                if attempt > 1:
                    time.sleep(self.config.backoff_s * 2 ** (attempt - 2))
                    self._phase(p, rollout_id, RolloutPhase.QUEUED)
                    queued = time.monotonic()
                if self._cancelled.is_set():
                    self._update(cancelled=1)
                    return RolloutOutcome.cancelled(p, rollout_id)
                try:
                    outcome = self._attempt(p, rollout_id, attempt, queued)
                except InfrastructureError as exc:
                    if self._cancelled.is_set():
                        self._update(cancelled=1)
                        return RolloutOutcome.cancelled(p, rollout_id)
                    self._update(infra_failures=1)
                    last = attempt == self.config.max_attempts
                    self._record_infra_failure(p, rollout_id, str(exc), retried=not last)
                    if last:
                        self._update(gave_up=1)
                        outcome = RolloutOutcome.infra_failed(p, rollout_id, attempt, str(exc))
                        self.run_dir.write_outcome(outcome)
                        return outcome
                    continue
                except OpenForgeError as exc:  # e.g. set-up or config: every attempt would fail
                    self._stop(p, rollout_id, attempt, exc)
                    raise
                self._update(done=1)
                return outcome
            raise AssertionError("unreachable")  # the loop returns on its last attempt
        finally:
            self._update(running=-1)

    def _stop(self, p: PlannedRollout, rollout_id: str, attempt: int, exc: Exception) -> None:
        """Record the attempt that met an error no attempt can pass; the caller raises it."""
        self._record_infra_failure(p, rollout_id, str(exc))
        outcome = RolloutOutcome.infra_failed(p, rollout_id, attempt, str(exc))
        self.run_dir.write_outcome(outcome)
        with self._lock:
            self._stopped.append(outcome)

    def _record_infra_failure(
        self, p: PlannedRollout, rollout_id: str, why: str, retried: bool = False
    ) -> None:
        """The attempt's infrastructure failure, and whether a new attempt plays its sample
        again (``retried``: then the new one is its group's member, schemas.rollout.RETRIED).
        If the proxy itself is what failed, the run directory still says so."""
        metadata = {RETRIED: "true"} if retried else None
        with contextlib.suppress(ServiceError):
            self._phase(
                p, rollout_id, RolloutPhase.INFRA_FAILED, message=why[:2000], metadata=metadata
            )

    def _attempt(
        self, p: PlannedRollout, rollout_id: str, attempt: int, queued: float
    ) -> RolloutOutcome:
        start = time.monotonic()
        meter = CostMeter()
        meter.add("queued_s", start - queued)
        fault = self.config.faults.pick_rollout(rollout_id) if self.config.faults else None
        try:
            reg = self.admin.register_rollout(
                rollout_id,
                task_id=p.task.id,
                group_id=p.group_id,
                harness=self.harness.name,
                harness_version=self.harness.version,
                metadata=p.started_metadata(attempt) | ({SANDBOX_FAULT: fault} if fault else {}),
            )
        except ServiceError as exc:
            raise InfrastructureError(f"cannot register with the proxy: {exc}") from exc
        registered_s = time.monotonic() - start
        meter.add("prepare_s", registered_s)  # the backend adds its lay-out
        job = RolloutJob(
            rollout_id,
            p.task,
            self.harness,
            reg.api_key or "",
            self.config.model,
            self.run_dir.rollout_root(rollout_id),
            proxy_url=reg.base_url,
            proxy_socket=Path(reg.unix_socket) if reg.unix_socket else None,
            fault=fault,
        )
        ended: list[AgentEnd] = []
        finished: list[Finished] = []

        def on_agent_end(agent: AgentEnd) -> None:
            ended.append(agent)
            if agent.phase is not RolloutPhase.FINISHED:
                self._update(agent_failures=1)
            finished.append(
                self.admin.finish_rollout(
                    rollout_id,
                    agent.phase,
                    exit_code=agent.exit_code,
                    backend=self.backend.name,
                    message=agent.message[:2000],
                )
            )

        try:
            verified = self.backend.run(job, on_agent_end)
        except ServiceError as exc:  # a restarted proxy worker forgot the rollout: a new one
            raise InfrastructureError(f"the proxy failed mid-rollout: {exc}") from exc
        finally:
            if not ended:  # never got to the agent's end: close the rollout at the proxy
                with contextlib.suppress(ServiceError):
                    self.admin.finish_rollout(
                        rollout_id, RolloutPhase.FAILED, backend=self.backend.name
                    )
        calls = self._proxy_saw(finished[0] if finished else None, registered_s, meter)
        return self._score(p, rollout_id, attempt, verified, start, calls, meter)

    def _proxy_saw(
        self, finished: Finished | None, registered_s: float, meter: CostMeter
    ) -> int | None:
        """What the proxy's finish answer says of the attempt: a context too short for the
        harness stops the run; the time to its first call is its ``ready_s``; its call count."""
        if finished is None:
            return None
        if finished.too_long is not None:
            raise ConfigError(too_long_message(self.harness.name, *finished.too_long))
        if finished.first_call_s is not None:  # the proxy's clock from registration on
            meter.add("ready_s", registered_s + finished.first_call_s)
        return finished.calls

    def _score(
        self,
        p: PlannedRollout,
        rollout_id: str,
        attempt: int,
        verified: Verified,
        start: float,
        calls: int | None,
        meter: CostMeter,
    ) -> RolloutOutcome:
        reward = verified.reward
        assert reward.reward is not None  # the backend raises otherwise
        source = reward.source.name if reward.source else "verifier"
        for name, value in verified.costs.items():
            meter.add(name, value)
        meter.add("agent_s", verified.agent.duration_s)
        meter.add("verifier_s", verified.verifier_duration_s)
        meter.add("wall_s", time.monotonic() - start)
        scored = Reward(
            reward.reward,
            dict(reward.components),
            f"{p.task.id}@{p.task.version}",
            verified.verifier_output,
        )  # recorded with its verified phase, in one write
        plan = self.config.faults
        fired = {SANDBOX_FAULTS: SandboxFault.dumps(verified.agent.faults)}
        self._phase(
            p,
            rollout_id,
            RolloutPhase.VERIFIED,
            message=source,
            costs=meter.costs,
            metadata=fired if plan is not None and plan.in_sandbox else None,
            reward=scored,
        )
        with self._lock:
            self.counts.rewards.append(reward.reward)
            self.counts.calls += calls or 0
        wall_s = time.monotonic() - start
        outcome = RolloutOutcome.verified(
            p, rollout_id, attempt, verified, wall_s, calls, meter.costs.get("ready_s")
        )
        self.run_dir.write_outcome(outcome)
        return outcome


def too_long_message(harness: str, prompt_tokens: int, context: int) -> str:
    """What to do when ``harness``'s prompt does not fit the model's context (a config error:
    every rollout would meet it, so the run stops once instead of scoring each 0)."""
    return (
        f"the {harness} harness sent a {prompt_tokens}-token prompt and the model's context is "
        f"{context} tokens: the proxy refused the call. Serve the model with a longer context "
        f"(openforge train: --set model.context={_room(prompt_tokens)}; rollouts run: a model "
        "built or served for it) or shorten the harness's prompt (harness.prompt = lean)"
    )


def _room(prompt_tokens: int) -> int:
    """A context with room for a few more turns after ``prompt_tokens``: the next power of 2
    at least twice the prompt."""
    return 1 << max(12, (2 * prompt_tokens - 1).bit_length())
