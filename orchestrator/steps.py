"""The phases of one local attempt: a single-step task is one agent phase and one verifier
phase; a multi-step task (Harbor 1.4 ``[[steps]]``) is, for each step in order, an agent phase
with the step's prompt in the same environment (workspace, home) and the step's verifier. The
rollout's reward is the task's ``multi_step_reward_strategy`` of the step rewards (``mean`` of
each key over the steps that were verified, a missing key counting 0; or ``final``), each step's
reward kept as the components ``<step>.<key>``. A step whose reward is below its
``min_reward`` ends the rollout there, as in Harbor.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from infra.tasks import Task, VerifierReward, harbor
from orchestrator.verifier import VerifierPhase

SINGLE = "task"  # the name of a single-step task's one phase


@dataclass(frozen=True)
class Phase:
    """One agent phase and the verifier after it."""

    name: str  # the step's name, or SINGLE
    instruction: str
    agent_timeout_s: float
    solution: Path | None
    artifacts: tuple[harbor.Artifact, ...]
    verifier: VerifierPhase
    min_reward: float | None = None

    @property
    def step(self) -> str | None:
        return None if self.name == SINGLE else self.name

    @property
    def agent_out(self) -> str:
        return "agent" if self.name == SINGLE else f"agent-{self.name}"


def _merged_tests(task: Task, step: harbor.Step, root: Path) -> Path:
    """``/tests`` of a step: the task's shared ``tests/`` with the step's own over it."""
    target = root / "tests" / step.name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for source in (task.tests_dir, step.tests_dir):
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
    return target


def phases(task: Task, root: Path) -> list[Phase]:
    """The attempt's phases, in order (laid out under ``root``)."""
    shared = harbor.artifacts(task)
    steps = harbor.steps(task)
    if not steps:
        verifier = VerifierPhase(task.tests_dir, task.verifier.timeout_sec, task.verifier.env)
        solution = task.solution_dir
        return [Phase(SINGLE, task.instruction, task.agent.timeout_sec, solution, shared, verifier)]
    return [
        Phase(
            step.name,
            step.instruction,
            step.agent_timeout_sec,
            step.solution_dir,
            shared + step.artifacts,
            VerifierPhase(
                _merged_tests(task, step, root),
                step.verifier_timeout_sec,
                step.verifier_env,
                name=f"verifier-{step.name}",
                logs=root / "logs" / f"verifier-{step.name}",
            ),
            step.min_reward,
        )
        for step in steps
    ]


def combine(task: Task, results: Sequence[tuple[str, VerifierReward]]) -> VerifierReward:
    """The rollout's reward from its phases' rewards (one phase: that reward, unchanged)."""
    if len(results) == 1 and results[0][0] == SINGLE:
        return results[0][1]
    rewarded = [(name, r) for name, r in results if r.reward is not None]
    components: dict[str, float] = {}
    for name, r in rewarded:
        components.update({f"{name}.{k}": v for k, v in r.components.items()})
    if not rewarded:
        return VerifierReward(None, error="no step was verified")
    if harbor.reward_strategy(task) is harbor.RewardStrategy.FINAL:
        final = rewarded[-1][1]
        reward = final.reward
        top: Mapping[str, float] = final.components
    else:
        keys = {k for _, r in rewarded for k in r.components}
        top = {k: sum(r.components.get(k, 0.0) for _, r in rewarded) / len(rewarded) for k in keys}
        reward = sum(r.reward or 0.0 for _, r in rewarded) / len(rewarded)
    components.update(top)
    components["reward"] = float(reward or 0.0)
    return VerifierReward(reward, MappingProxyType(components), rewarded[-1][1].source)
