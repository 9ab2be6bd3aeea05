"""The rollout-backend interface: play one rollout (the agent, then the verifier) somewhere.

The orchestrator owns everything around a rollout (its key, its events, retries, concurrency);
a backend only runs it: lays out the task's environment, runs the harness with the proxy as its
only way out, stops everything it started, then runs the task's verifier in a fresh sandbox over
the final workspace with the tests mounted for the verifier alone, and reads the reward.

Contract: :meth:`RolloutBackend.run` reports the agent's end through ``on_agent_end`` as soon as
it is known (so the proxy can close the rollout before the verifier runs), returns the verified
outcome, and raises :class:`~schemas.errors.InfrastructureError` for anything that is not the
agent's doing. :meth:`cancel` stops every rollout running now (from another thread).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from infra.harnesses import Harness
from infra.tasks import Task, VerifierReward
from schemas.enums import RolloutPhase


class RolloutBackendName(StrEnum):
    """The rollout backends, by registry name (``--backend``, ``rollouts.backend``)."""

    LOCAL = "local"  # bubblewrap sandboxes on this machine
    KUBERNETES = "kubernetes"  # one pod per rollout on a cluster


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


@dataclass(frozen=True)
class AgentEnd:
    """How the agent's run ended."""

    phase: RolloutPhase  # finished | failed | timed_out
    exit_code: int | None
    duration_s: float
    message: str
    final_message: str | None = None  # what the harness said last, if it says
    session_id: str | None = None


@dataclass(frozen=True)
class Verified:
    """The agent's end and the verifier's reward."""

    agent: AgentEnd
    reward: VerifierReward
    verifier_exit_code: int | None
    verifier_duration_s: float
    files: dict[str, Path] = field(default_factory=dict)  # logs and outputs kept, by name


class RolloutBackend(abc.ABC):
    """Runs rollouts; one instance serves many concurrent :meth:`run` calls (threads)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def check(self, task: Task, harness: Harness) -> list[str]:
        """Refuse (ConfigError, saying where it can run) a task this backend cannot run; else
        the notes the run's log should show (how the task's environment is provided)."""

    @abc.abstractmethod
    def run(self, job: RolloutJob, on_agent_end: Callable[[AgentEnd], None]) -> Verified:
        """Play ``job`` to its verified end; see the module docstring."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Stop every rollout running now; their :meth:`run` calls then raise or return."""

    def close(self) -> None:  # noqa: B027 - a hook: most backends hold nothing
        """Release what the backend made for its rollouts (called once, after the last
        :meth:`run`); nothing by default."""
