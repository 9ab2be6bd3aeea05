"""Rollouts paced to the trainer, and the held-out evaluations, through the orchestrator.

The rollouts for update ``s`` (``tasks.per_step`` training tasks, each played
``rollouts.samples_per_task`` times as one group) are admitted once the served policy version is
at least ``s - 1 - max_staleness``: with ``max_staleness = 0`` every update trains on rollouts of
the policy it updates, and with more, rollouts of the next update overlap the current one by that
many versions. Nothing is played that the trainer would not use, so there is no backlog by design.

Before the rollouts of an update, and once the trainer has made its last update, the held-out
split is played at the served version when that version is a multiple of ``evaluation.every``
(version 0 is the initial policy). Held-out rollouts go through the same proxy, pipeline and
event log (they are audited like any other) but the trainer never trains on them: its stream
admits only training tasks. With ``[faults] heldout = "both"``, each evaluation plays the
held-out split a second time with a sandbox fault in every rollout (:class:`FaultedEval`,
``eval-faulted.csv``): the held-out reward under faults beside the clean one.
"""

from __future__ import annotations

import csv
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.proxy_client import ProxyAdmin
from infra.tasks import Task
from orchestrator.plan import plan
from orchestrator.run import Orchestrator
from orchestrator.rundir import RolloutOutcome, Status
from schemas.errors import InfrastructureError

EVAL_FIELDS = ["policy_version", "mean_reward", "rollouts", "seconds"]


@dataclass(frozen=True)
class Evaluation:
    policy_version: int
    mean_reward: float
    rollouts: int
    seconds: float


class EvalLog:
    """``eval.csv`` in the run directory: one row per held-out evaluation (kept across resumes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[Evaluation] = []
        if path.exists():
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    self.rows.append(
                        Evaluation(
                            int(row["policy_version"]),
                            float(row["mean_reward"]),
                            int(row["rollouts"]),
                            float(row["seconds"]),
                        )
                    )

    def done(self, version: int) -> bool:
        return any(r.policy_version == version for r in self.rows)

    def add(self, evaluation: Evaluation) -> None:
        self.rows.append(evaluation)
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(EVAL_FIELDS)
            writer.writerow(
                [
                    evaluation.policy_version,
                    f"{evaluation.mean_reward:.6f}",
                    evaluation.rollouts,
                    f"{evaluation.seconds:.3f}",
                ]
            )

    @property
    def last(self) -> Evaluation | None:
        return self.rows[-1] if self.rows else None


@dataclass(frozen=True)
class Pacing:
    steps: int  # the run's last update
    per_step: int  # training tasks per update
    samples: int  # rollouts per task (a group)
    max_staleness: int
    eval_every: int
    eval_samples: int
    seed: int
    # How long an update may take to be served once its rollouts have ended: past it, the run
    # fails saying so, rather than wait for a batch that will never be formed.
    update_wait_s: float = 3600.0


@dataclass(frozen=True)
class FaultedEval:
    """The held-out split played again with faults: its orchestrator (every rollout faulted)
    and its log (``eval-faulted.csv``)."""

    orchestrator: Orchestrator
    log: EvalLog


class RolloutDriver(threading.Thread):
    """Plays the rollouts of updates ``first_step..pacing.steps`` and the evaluations due."""

    def __init__(
        self,
        admin: ProxyAdmin,
        train: Orchestrator,
        evaluate: Orchestrator,
        train_tasks: Sequence[Task],
        heldout: Sequence[Task],
        pacing: Pacing,
        evals: EvalLog,
        first_step: int,
        tag: str,
        stop: threading.Event,
        faulted: FaultedEval | None = None,
    ) -> None:
        super().__init__(daemon=True, name="rollout-driver")
        self.faulted = faulted
        self.admin, self.train_orch, self.eval_orch = admin, train, evaluate
        self.train_tasks, self.heldout = list(train_tasks), list(heldout)
        self.pacing, self.evals, self.first_step, self.tag = pacing, evals, first_step, tag
        self.stop = stop
        self.error: BaseException | None = None
        self.evaluating = False

    def tasks_for(self, step: int) -> list[Task]:
        """The training tasks of update ``step``: a draw that depends only on seed and step."""
        if self.pacing.per_step >= len(self.train_tasks):
            return list(self.train_tasks)
        return random.Random(f"{self.pacing.seed}-{step}").sample(
            self.train_tasks, self.pacing.per_step
        )

    def _wait_for(self, version: int) -> int | None:
        """Wait until the served policy version is at least ``version``; None when stopped.
        Raises when it is not served within ``pacing.update_wait_s``."""
        deadline = time.monotonic() + self.pacing.update_wait_s
        while not self.stop.is_set():
            current = self.admin.policy_version()
            if current >= version:
                return current
            if time.monotonic() > deadline:
                raise InfrastructureError(
                    f"policy version {version} was not served within "
                    f"{self.pacing.update_wait_s:.0f} s of its rollouts' end (still {current}): "
                    "the trainer got no batch; its log under trainer/ and the pipeline's "
                    "(pipeline.log) in the run directory say why"
                )
            time.sleep(0.1)
        return None

    def _maybe_evaluate(self, version: int, final: bool = False) -> None:
        due = final or version % self.pacing.eval_every == 0
        if not self.heldout or not due:
            return
        self._evaluate(version, self.eval_orch, self.evals, "eval")
        if self.faulted is not None:
            self._evaluate(version, self.faulted.orchestrator, self.faulted.log, "evalf")

    def _evaluate(self, version: int, orch: Orchestrator, log: EvalLog, name: str) -> None:
        """The held-out split at ``version`` through ``orch``, its mean reward into ``log``."""
        if log.done(version):
            return
        self.evaluating = True
        t0 = time.monotonic()
        try:
            planned = plan(self.heldout, self.pacing.eval_samples, f"{self.tag}-{name}-v{version}")
            records = orch.run(planned)
        finally:
            self.evaluating = False
        rewards = [r.reward for r in records if r.reward is not None]
        if self.stop.is_set() or not rewards:
            return
        log.add(
            Evaluation(version, sum(rewards) / len(rewards), len(rewards), time.monotonic() - t0)
        )

    def run(self) -> None:
        try:
            step = self.first_step
            while step <= self.pacing.steps and not self.stop.is_set():
                version = self._wait_for(step - 1 - self.pacing.max_staleness)
                if version is None:
                    return
                self._maybe_evaluate(version)
                planned = plan(self.tasks_for(step), self.pacing.samples, f"{self.tag}-s{step}")
                _check_round(step, self.train_orch.run(planned), self.stop)
                step += 1
            final = self._wait_for(self.pacing.steps)
            if final is not None:  # the last version is evaluated whatever `every` says
                self._maybe_evaluate(final, final=True)
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            self.stop.set()


def _check_round(step: int, outcomes: Sequence[RolloutOutcome], stop: threading.Event) -> None:
    """An update whose rollouts all failed for infrastructure reasons gets no batch: say why
    instead of waiting for it."""
    if stop.is_set() or not outcomes or any(o.status is Status.VERIFIED for o in outcomes):
        return
    reasons = sorted({o.message for o in outcomes if o.message})
    raise InfrastructureError(
        f"none of the {len(outcomes)} rollouts of update {step} was verified, so it can get no "
        f"batch: {'; '.join(reasons[:3]) or 'no reason recorded'} "
        "(each rollout's files are under rollouts/ in the run directory)"
    )
