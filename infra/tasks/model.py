"""The Harbor task model: one task directory, read into frozen dataclasses.

A task is a directory in Harbor's layout (https://harborframework.com/docs/tasks)::

    task-name/
        task.toml            settings (this module's dataclasses), all keys optional
        instruction.md       the prompt given to the agent
        environment/         files laid into the workspace; may hold a Dockerfile
        tests/test.sh        the verifier: writes /logs/verifier/reward.txt or reward.json
        solution/solve.sh    optional reference solution (what the ``oracle`` harness runs)

Defaults are Harbor's (``harbor.models.task.config``). Keys this model does not know are kept,
never rejected, in the ``extra`` mapping of the section they were found in, so that a task set
written for Harbor (or a newer Harbor) loads unchanged. Every mapping here is read-only and every
list a tuple, so a loaded task cannot be changed by accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from schemas.errors import TaskError


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


# Harbor's defaults. Harbor >= 0.3 leaves ``[agent] timeout_sec`` unset (the trial then uses its
# own default); earlier versions, and we, use 600 s so that a rollout always has a deadline.
DEFAULT_AGENT_TIMEOUT_SEC = 600.0
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
DEFAULT_WORKDIR = "/app"  # the WORKDIR of nearly every Harbor image


class Split(StrEnum):
    """Which part of a dataset a task belongs to (the manifest's ``split`` field)."""

    TRAIN = "train"  # rollouts are trained on
    HELDOUT = "heldout"  # only evaluated


@dataclass(frozen=True)
class TaskMetadata:
    """``[metadata]``: who wrote the task and how to file it; informational only."""

    author_name: str | None = None
    author_email: str | None = None
    difficulty: str | None = None  # easy | medium | hard, by convention
    category: str | None = None  # e.g. programming, debugging, data-science
    tags: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=_empty)  # e.g. expert_time_estimate_min


@dataclass(frozen=True)
class AgentSettings:
    """``[agent]``: how the harness runs."""

    timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC  # the rollout's deadline
    extra: Mapping[str, Any] = field(default_factory=_empty)  # e.g. user, network_mode
    # Set by a run (Harbor's --agent-timeout-multiplier), never by task.toml: it scales
    # ``timeout_sec`` and each step's own agent timeout.
    timeout_multiplier: float = 1.0


@dataclass(frozen=True)
class VerifierSettings:
    """``[verifier]``: how ``tests/test.sh`` runs after the agent."""

    timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    env: Mapping[str, str] = field(default_factory=_empty)  # variables set for test.sh
    extra: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True)
class EnvironmentSettings:
    """``[environment]``: the sandbox the task needs.

    ``memory`` and ``storage`` (Harbor's deprecated size strings such as ``"2G"``, ``"512M"``)
    are read into ``memory_mb`` and ``storage_mb`` and, as in Harbor, win over them.
    ``workdir`` is an OpenForge extension (Harbor takes it from the Dockerfile's ``WORKDIR`` and
    ignores the key): the absolute path of the workspace inside the sandbox, where the
    ``environment/`` files are laid and the harness and ``solve.sh`` run.
    """

    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    docker_image: str | None = None  # a prebuilt image instead of environment/Dockerfile
    cpus: int = 1
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0
    gpu_types: tuple[str, ...] | None = None  # acceptable GPU types; None: any
    allow_internet: bool | None = None  # None: not said (Harbor: allowed; a local sandbox: no)
    env: Mapping[str, str] = field(default_factory=_empty)  # variables set in the sandbox
    workdir: str = DEFAULT_WORKDIR
    extra: Mapping[str, Any] = field(
        default_factory=_empty
    )  # e.g. mcp_servers, skills_dir, healthcheck


@dataclass(frozen=True)
class Task:
    """One task, loaded and checked: the files it needs exist and its settings have the right
    types. ``id`` is the directory's name unless a manifest names it."""

    id: str
    path: Path  # the task directory (absolute)
    instruction: str  # the text of instruction.md
    version: str = "1.0"  # task.toml ``version`` (Harbor's ``schema_version``)
    metadata: TaskMetadata = field(default_factory=TaskMetadata)
    agent: AgentSettings = field(default_factory=AgentSettings)
    verifier: VerifierSettings = field(default_factory=VerifierSettings)
    environment: EnvironmentSettings = field(default_factory=EnvironmentSettings)
    solution_env: Mapping[str, str] = field(
        default_factory=_empty
    )  # ``[solution] env``: variables for solve.sh
    split: Split = Split.TRAIN  # set from the dataset manifest
    extra: Mapping[str, Any] = field(
        default_factory=_empty
    )  # unknown top-level keys and tables, e.g. artifacts

    @property
    def config_file(self) -> Path:
        return self.path / "task.toml"

    @property
    def instruction_file(self) -> Path:
        return self.path / "instruction.md"

    @property
    def environment_dir(self) -> Path | None:
        """The files to lay into the workspace (None: the task has none)."""
        path = self.path / "environment"
        return path if path.is_dir() else None

    @property
    def dockerfile(self) -> Path | None:
        """``environment/Dockerfile`` if the task has one (not parsed here)."""
        env = self.environment_dir
        path = env / "Dockerfile" if env is not None else None
        return path if path is not None and path.is_file() else None

    @property
    def tests_dir(self) -> Path:
        """Mounted at ``/tests`` for the verifier."""
        return self.path / "tests"

    @property
    def test_script(self) -> Path:
        return self.tests_dir / "test.sh"

    @property
    def solution_dir(self) -> Path | None:
        """Mounted at ``/solution`` for the ``oracle`` harness (None: no solution)."""
        path = self.path / "solution"
        return path if (path / "solve.sh").is_file() else None

    @property
    def solve_script(self) -> Path | None:
        sol = self.solution_dir
        return sol / "solve.sh" if sol is not None else None

    def with_memory(self, memory_mb: int) -> Task:
        """The task with its sandbox's memory set to ``memory_mb`` (as Harbor's
        ``--override-memory-mb``: what a harness needs can exceed what the task declares)."""
        return replace(self, environment=replace(self.environment, memory_mb=memory_mb))

    def with_agent_timeout_multiplier(self, multiplier: float) -> Task:
        """The task with every agent deadline (its own and each step's) scaled by
        ``multiplier`` (as Harbor's ``--agent-timeout-multiplier``: a slower machine than the
        task's author's). The verifier's deadlines are the task's own."""
        if multiplier <= 0:
            raise TaskError(f"an agent timeout multiplier must be above 0, not {multiplier}")
        agent = replace(
            self.agent,
            timeout_sec=self.agent.timeout_sec * multiplier,
            timeout_multiplier=self.agent.timeout_multiplier * multiplier,
        )
        return replace(self, agent=agent)
