"""Harbor's task schema 1.4 (the ``harbor`` package 0.25): what its newer keys ask for, read
from a loaded :class:`~infra.tasks.model.Task` (they are kept in its ``extra`` mappings).

- The verifier's environment (``[verifier] environment_mode``, ``[verifier.environment]``):
  ``shared`` (the default without a verifier environment) runs ``tests/test.sh`` in a fresh
  container of the task's own image over the agent's final workspace; ``separate`` (what
  ``harbor init`` writes, and implied by a ``[verifier.environment]`` table) runs it in a
  container of its own image: built from ``tests/Dockerfile`` (context ``tests/``), else the
  table's ``docker_image``, else the task's image; it sees the agent's ``artifacts``, not its
  workspace (:func:`verifier_plan`).
- ``artifacts`` (top level, and per step): paths collected from the agent's container after it
  ran, kept under the attempt's ``artifacts/`` at their path without the leading ``/`` (or
  ``destination``), and shown to the verifier at their own path, as Harbor re-materializes
  them; the agent's ``/logs/artifacts`` is always collected (``artifacts/logs/artifacts``).
- Multi-step tasks (``[[steps]]``, ``steps/<name>/`` each with ``instruction.md``,
  ``solution/``, ``tests/``): :func:`steps`; the rollout's reward is
  ``multi_step_reward_strategy`` (``mean``, the default, or ``final``) of the step rewards.
- ``network_mode`` (``no-network`` or ``public``; ``allowlist`` is refused here), ``[agent]`` and
  ``[verifier]`` ``user``.

:func:`refusals` names what a rollout would need and OpenForge does not provide yet (MCP
servers, health checks, skills, GPUs, Windows, compose files, ``[[verifier.collect]]``,
network allowlists): such a task is refused with the reason, never run with the key ignored.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from infra.tasks.model import Task
from schemas.errors import TaskError


class VerifierMode(StrEnum):
    SHARED = "shared"  # over the agent's final workspace, in the task's own image
    SEPARATE = "separate"  # in a container of its own image, seeing only the artifacts


class RewardStrategy(StrEnum):
    MEAN = "mean"  # each key's mean over the steps that have a reward (missing keys: 0)
    FINAL = "final"  # the last step's reward


@dataclass(frozen=True)
class Artifact:
    """A path in the agent's container (``source``) shown to the verifier at
    ``/logs/artifacts/<destination>``."""

    source: str
    destination: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifierPlan:
    """Where the verifier runs: its mode, and with ``separate`` the image it is built from."""

    mode: VerifierMode
    dockerfile: Path | None = None  # tests/Dockerfile (its context: its directory)
    docker_image: str | None = None  # else a prebuilt image; neither: the task's own image


@dataclass(frozen=True)
class Step:
    """One step of a multi-step task: a prompt, its solution and its tests, run in order in the
    same environment."""

    name: str
    directory: Path
    instruction: str
    agent_timeout_sec: float
    verifier_timeout_sec: float
    verifier_env: Mapping[str, str]
    artifacts: tuple[Artifact, ...]
    min_reward: float | None
    verifier_extra: Mapping[str, Any]  # its [steps.verifier] table (environment_mode, ...)

    @property
    def solution_dir(self) -> Path | None:
        path = self.directory / "solution"
        return path if (path / "solve.sh").is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.directory / "tests"


def _verifier_table(verifier: Mapping[str, Any]) -> Mapping[str, Any] | None:
    table = verifier.get("environment")
    return table if isinstance(table, Mapping) else None


def verifier_plan(
    task: Task, verifier: Mapping[str, Any] | None = None, tests: Path | None = None
) -> VerifierPlan:
    """The verifier's environment for ``task`` (or one of its steps: its ``[steps.verifier]``
    table and tests directory)."""
    extra = task.verifier.extra if verifier is None else verifier
    tests = tests or task.tests_dir
    mode_value = extra.get("environment_mode")
    table = _verifier_table(extra)
    if mode_value is None and verifier is not None:  # a step inherits the task's mode
        return verifier_plan(task, None, tests) if table is None else _separate(table, tests)
    if mode_value is None:
        mode_value = VerifierMode.SEPARATE if table is not None else VerifierMode.SHARED
    try:
        mode = VerifierMode(mode_value)
    except ValueError:
        raise TaskError(
            f"{task.config_file}: [verifier] environment_mode must be 'shared' or 'separate', "
            f"got {mode_value!r}"
        ) from None
    if mode is VerifierMode.SHARED:
        if table is not None:
            raise TaskError(
                f"{task.config_file}: [verifier] environment_mode = 'shared' conflicts with a "
                "[verifier.environment] table: drop one of them"
            )
        return VerifierPlan(mode)
    return _separate(table or {}, tests)


def _separate(table: Mapping[str, Any], tests: Path) -> VerifierPlan:
    dockerfile = tests / "Dockerfile"
    if dockerfile.is_file():
        return VerifierPlan(VerifierMode.SEPARATE, dockerfile=dockerfile)
    image = table.get("docker_image")
    return VerifierPlan(
        VerifierMode.SEPARATE, docker_image=image if isinstance(image, str) else None
    )


def _artifacts(raw: Any, where: str) -> tuple[Artifact, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise TaskError(f"{where}: artifacts must be a list of paths or tables")
    out = []
    for item in raw:
        if isinstance(item, str):
            source, destination, exclude = item, None, ()
        elif isinstance(item, Mapping) and isinstance(item.get("source"), str):
            source, destination = item["source"], item.get("destination")
            exclude = tuple(item.get("exclude") or ())
            if item.get("service"):
                raise TaskError(
                    f"{where}: an artifact of another service ({item['service']!r}) "
                    "needs a compose environment, which is not supported yet"
                )
        else:
            raise TaskError(f"{where}: an artifact is a path or a table with a source: {item!r}")
        if not source.startswith("/") or ".." in source.split("/"):
            raise TaskError(f"{where}: artifact source {source!r} must be an absolute path")
        parts = [p for p in posixpath.normpath(destination or source).split("/") if p]
        out.append(Artifact(posixpath.normpath(source), "/".join(parts), exclude))
    return tuple(out)


def artifacts(task: Task) -> tuple[Artifact, ...]:
    """The task's top-level ``artifacts``."""
    return _artifacts(task.extra.get("artifacts"), str(task.config_file))


def reward_strategy(task: Task) -> RewardStrategy:
    value = task.extra.get("multi_step_reward_strategy") or RewardStrategy.MEAN
    try:
        return RewardStrategy(value)
    except ValueError:
        raise TaskError(
            f"{task.config_file}: multi_step_reward_strategy must be 'mean' or 'final', "
            f"got {value!r}"
        ) from None


def _agent_timeout(agent: Mapping[str, Any], task: Task) -> float:
    """A step's agent deadline: its own ``timeout_sec`` scaled by the run's multiplier, else the
    task's (already scaled)."""
    own = agent.get("timeout_sec")
    return float(own) * task.agent.timeout_multiplier if own else task.agent.timeout_sec


def rollout_deadline_s(task: Task) -> float:
    """The longest a rollout of ``task`` may take once started, by the task's own settings: its
    image build, then its agent's deadline and its verifier's (each step's, if it has steps)."""
    parts = steps(task)
    if parts:
        play = sum(s.agent_timeout_sec + s.verifier_timeout_sec for s in parts)
    else:
        play = task.agent.timeout_sec + task.verifier.timeout_sec
    return task.environment.build_timeout_sec + play


def steps(task: Task) -> tuple[Step, ...]:
    """The task's steps, in order (none for a single-step task); TaskError for a step whose
    directory or instruction is missing."""
    raw = task.extra.get("steps")
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple) or not raw:
        raise TaskError(f"{task.config_file}: steps must be a non-empty array of tables")
    out = []
    for i, entry in enumerate(raw):
        where = f"{task.config_file}: steps[{i}]"
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise TaskError(f"{where}: a step needs a name (its directory under steps/)")
        directory = task.path / "steps" / name
        instruction = directory / "instruction.md"
        if not instruction.is_file() or not instruction.read_text(encoding="utf-8").strip():
            raise TaskError(f"{instruction}: missing or empty; each step needs its prompt")
        agent = entry.get("agent") or {}
        verifier = entry.get("verifier") or {}
        minimum = entry.get("min_reward")
        out.append(
            Step(
                name=name,
                directory=directory,
                instruction=instruction.read_text(encoding="utf-8"),
                agent_timeout_sec=_agent_timeout(agent, task),
                verifier_timeout_sec=float(
                    verifier.get("timeout_sec") or task.verifier.timeout_sec
                ),
                verifier_env={**task.verifier.env, **(verifier.get("env") or {})},
                artifacts=_artifacts(entry.get("artifacts"), where),
                min_reward=float(minimum) if isinstance(minimum, int | float) else None,
                verifier_extra=verifier,
            )
        )
    return tuple(out)


def has_solution(task: Task) -> bool:
    """A reference solution to run: ``solution/solve.sh``, or one in every step."""
    multi = steps(task)
    if multi:
        return all(step.solution_dir is not None for step in multi)
    return task.solution_dir is not None


def network_public(task: Task) -> bool:
    """``allow_internet = true``: the task says it needs the internet. (``network_mode =
    "public"`` is Harbor's default, which ``harbor init`` writes out: it is said in the run's log,
    see :func:`network_note`, not taken as a need.)"""
    return bool(task.environment.allow_internet)


def network_note(task: Task) -> str | None:
    if task.environment.extra.get("network_mode") == "public" and not network_public(task):
        return (
            f"{task.id}: network_mode = 'public' (Harbor's default): the local sandbox reaches "
            "only the proxy"
        )
    return None


def _user(section: Mapping[str, Any]) -> str | None:
    value = section.get("user")
    return None if value is None else str(value)


def agent_user(task: Task) -> str | None:
    return _user(task.agent.extra)


def verifier_user(task: Task) -> str | None:
    return _user(task.verifier.extra)


def refusals(task: Task) -> list[str]:
    """What ``task`` asks for that OpenForge does not provide yet (empty: nothing)."""
    env, out = task.environment.extra, []
    for key, what in (
        ("mcp_servers", "MCP servers"),
        ("healthcheck", "a health check"),
        ("skills_dir", "agent skills"),
        ("tpu", "a TPU"),
    ):
        if env.get(key):
            out.append(f"[environment] {key}: {what} (not supported yet)")
    if task.environment.gpus:
        out.append(f"[environment] gpus = {task.environment.gpus}: GPUs in a local sandbox")
    if env.get("os", "linux") != "linux":
        out.append(f"[environment] os = {env['os']!r}: only Linux images run here")
    for name, section in (
        ("environment", env),
        ("agent", task.agent.extra),
        ("verifier", task.verifier.extra),
    ):
        if section.get("network_mode") == "allowlist" or section.get("allowed_hosts"):
            out.append(f"[{name}] network_mode = 'allowlist': per-host network allowlists")
    if task.verifier.extra.get("collect"):
        out.append("[[verifier.collect]]: commands in compose services")
    env_dir = task.environment_dir
    if env_dir is not None and (env_dir / "docker-compose.yaml").exists():
        out.append("environment/docker-compose.yaml: compose environments")
    return out


def check(task: Task) -> None:
    """TaskError naming every refusal of ``task`` (and any malformed 1.4 key), else nothing."""
    verifier_plan(task)
    artifacts(task)
    for step in steps(task):
        verifier_plan(task, step.verifier_extra, step.tests_dir)
    reward_strategy(task)
    refused = refusals(task)
    if refused:
        raise TaskError(
            f"task {task.id} ({task.config_file}) needs what OpenForge does not provide yet: "
            + "; ".join(refused)
        )
