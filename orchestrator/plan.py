"""What to run: every task ``samples`` times, the samples of a task forming one group.

Group-relative advantages (GRPO, RLOO) compare rollouts of the same task, so the samples of a
task share a ``group_id``. Rollout ids are deterministic for a plan (``{run}-{task}-{sample}``)
so a rerun of the same plan names the same rollouts; a retried attempt adds ``-a{n}``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from infra.tasks import Task, harbor
from schemas.errors import ConfigError
from schemas.rollout import DEADLINE_S

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _slug(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-") or "x"


@dataclass(frozen=True)
class PlannedRollout:
    """One rollout to run: ``task`` played once, sample ``sample`` of its group."""

    task: Task
    sample: int
    group_id: str
    base_id: str  # the id of the first attempt; later attempts add -a2, -a3, ...

    def rollout_id(self, attempt: int) -> str:
        return self.base_id if attempt == 1 else f"{self.base_id}-a{attempt}"

    def started_metadata(self, attempt: int) -> dict[str, str]:
        """What an attempt's ``started`` event says of it: its sample, its attempt, and how
        long its task allows it (:data:`~schemas.rollout.DEADLINE_S`: assembly waits that long
        for its reward)."""
        deadline = harbor.rollout_deadline_s(self.task)
        return {"sample": str(self.sample), "attempt": str(attempt), DEADLINE_S: f"{deadline:g}"}


def plan(tasks: Sequence[Task], samples: int, run_id: str) -> list[PlannedRollout]:
    """Each task ``samples`` times, task by task (a group finishes early, so the trainer can
    start on it), in the dataset's order."""
    if samples < 1:
        raise ConfigError(f"samples per task must be at least 1, not {samples}")
    if not tasks:
        raise ConfigError("no tasks to run: check the dataset path and the split")
    run = _slug(run_id)
    out = []
    for task in tasks:
        group = f"{run}-{_slug(task.id)}"
        for sample in range(samples):
            out.append(PlannedRollout(task, sample, group, f"{group}-{sample}"))
    return out
