"""The rollout-backend interface: play one rollout (the agent, then the verifier) somewhere.

The orchestrator owns everything around a rollout (its key, its events, retries, concurrency);
a backend only runs it: lays out the task's environment, runs the harness with what the harness
declares it needs (:class:`~infra.harnesses.Capabilities`: the proxy as its only way out or no
network at all, the task's solution), stops everything it started, then runs the task's verifier
in a fresh sandbox over the final workspace with the tests mounted for the verifier alone, and
reads the reward.

Contract of every backend (``tests/orchestrator/test_backend_contract.py`` runs the same cases
over each):

- it is built from its own config section and the run's proxy:
  :meth:`RolloutBackend.from_config` (:mod:`orchestrator.registry` picks it by name);
- :meth:`~RolloutBackend.preflight` raises :class:`~schemas.errors.SetupError` or
  :class:`~schemas.errors.ConfigError`, whose message says the fix, for what would fail every
  rollout of the harness (the backend's own tools or access, the harness's install), before any
  rollout starts;
- :meth:`~RolloutBackend.check` refuses (ConfigError, saying where it can run) a task it cannot
  run with the harness;
- :meth:`~RolloutBackend.run` reports the agent's end through ``on_agent_end`` as soon as it is
  known (so the proxy can close the rollout before the verifier runs) and returns
  :class:`Verified`, which holds everything the orchestrator records of the rollout. It raises
  :class:`~schemas.errors.InfrastructureError` for a failure that is not the agent's doing and
  may not recur on another attempt (a sandbox or pod that did not start, a verifier that gave no
  reward), and SetupError or ConfigError for one that every attempt would meet;
- :meth:`~RolloutBackend.cancel` stops every rollout running now (from another thread).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from infra.harnesses import Harness
from infra.sandbox import ProxyEndpoint
from infra.tasks import Task, VerifierReward, harbor
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError
from schemas.faults import ROLLOUT_FAULTS, FaultKind, FaultPlan, SandboxFault
from schemas.registry import one_of


class RolloutBackendName(StrEnum):
    """The rollout backends, by registry name (``--backend``, ``rollouts.backend``)."""

    LOCAL = "local"  # bubblewrap sandboxes on this machine
    KUBERNETES = "kubernetes"  # one pod per rollout on a cluster


@dataclass(frozen=True)
class RunProxy:
    """The run's capture proxy, as every backend is given it; each uses what it reaches it by."""

    url: str  # its base URL from this machine (its admin API's)
    # Its Unix socket, and the port a sandbox sees it on (None: it listens on none).
    socket: ProxyEndpoint | None = None


@dataclass(frozen=True)
class RolloutJob:
    """One attempt of one rollout, as the backend needs it."""

    rollout_id: str
    task: Task
    harness: Harness
    api_key: str  # the rollout's key: all the agent gets
    model: str  # the model name the harness asks the proxy for
    root: Path  # host directory for this attempt's files (workspace, logs, outputs)
    # Behind a proxy pool (`openforge proxy --workers N`), the worker that owns the rollout, from
    # its registration answer: the harness calls it directly, never through the pool's front.
    # None (a single proxy): the backend's own proxy endpoint.
    proxy_url: str | None = None  # the worker's base URL (the Kubernetes backend's pods)
    proxy_socket: Path | None = None  # the worker's Unix socket (the local sandbox's forwarder)
    fault: FaultKind | None = None  # the sandbox fault drawn for it (schemas.faults); None: none


@dataclass(frozen=True)
class AgentEnd:
    """How the agent's run ended."""

    phase: RolloutPhase  # finished | failed | timed_out
    exit_code: int | None
    duration_s: float
    message: str
    final_message: str | None = None  # what the harness said last, if it says
    session_id: str | None = None
    faults: tuple[SandboxFault, ...] = ()  # the sandbox faults that fired in it

    @staticmethod
    def of_all(ends: Sequence[AgentEnd]) -> AgentEnd:
        """The agent's phases as one end: the last one's, with the time and the faults of all
        of them, failed or timed out if any was."""
        last = ends[-1]
        worst = next((e for e in ends if e.phase is not RolloutPhase.FINISHED), last)
        return dataclasses.replace(
            worst,
            duration_s=sum(e.duration_s for e in ends),
            final_message=last.final_message,
            faults=tuple(f for e in ends for f in e.faults),
        )


@dataclass(frozen=True)
class Verified:
    """Everything the orchestrator records of a verified rollout: the agent's end, the reward,
    the verifier's exit code, duration and output, and the files kept. The orchestrator reads
    nothing else of the backend's (no file under the attempt's directory)."""

    agent: AgentEnd
    reward: VerifierReward
    verifier_exit_code: int | None
    verifier_duration_s: float
    files: dict[str, Path] = field(default_factory=dict)  # logs and outputs kept, by name
    verifier_output: str | None = None  # the end of what the verifier printed; None: not kept
    costs: dict[str, float] = field(default_factory=dict)  # what the backend measured (COSTS)


def require_solution(task: Task, harness: Harness) -> None:
    """ConfigError when ``harness`` runs the task's own solution and ``task`` has none."""
    if harness.capabilities.runs_solution and not harbor.has_solution(task):
        raise ConfigError(
            f"task {task.id} has no solution/solve.sh for the {harness.name} harness: add one "
            "or pick another harness"
        )


class RolloutBackend(abc.ABC):
    """Runs rollouts; one instance serves many concurrent :meth:`run` calls (threads)."""

    name: ClassVar[RolloutBackendName]
    # Whether it injects the sandbox faults of schemas.faults (RolloutJob.fault).
    sandbox_faults: ClassVar[bool] = False

    @classmethod
    def check_faults(cls, faults: FaultPlan | None) -> None:
        """ConfigError if ``faults`` draws sandbox faults this backend does not inject (checked
        before anything starts)."""
        if faults is not None and faults.in_sandbox and not cls.sandbox_faults:
            raise ConfigError(
                f"the {cls.name} backend does not inject sandbox faults "
                f"({one_of(ROLLOUT_FAULTS)}) yet: run them on the local backend"
            )

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Any, proxy: RunProxy) -> RolloutBackend:
        """The backend of ``config`` (its own section's type) for a run whose proxy is
        ``proxy``; ConfigError when the section cannot work with that proxy."""

    @abc.abstractmethod
    def preflight(self, harness: Harness) -> None:
        """Raise SetupError or ConfigError (saying the fix) now for what would fail every rollout
        of ``harness`` on this backend; the orchestrator calls it before the first rollout."""

    @abc.abstractmethod
    def check(self, task: Task, harness: Harness) -> list[str]:
        """Refuse (ConfigError, saying where it can run) a task this backend cannot run with
        ``harness``; else the notes the run's log should show (how the task's environment is
        provided)."""

    @abc.abstractmethod
    def runs_in(self, task: Task) -> str:
        """Where a rollout of ``task`` runs on this backend, in one word for people:
        ``bubblewrap``, ``container`` or ``pod``."""

    @abc.abstractmethod
    def run(self, job: RolloutJob, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        """Play ``job`` to its verified end; see the module docstring."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop every rollout running now; their :meth:`run` calls then raise or return."""

    def close(self) -> None:  # noqa: B027 - a hook: most backends hold nothing
        """Release what the backend made for its rollouts (called once, after the last
        :meth:`run`); nothing by default."""
