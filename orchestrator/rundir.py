"""A job's run directory: one folder per rollout attempt, and a summary at the end.

OUT/rollouts/ROLLOUT/           one attempt (see orchestrator.local for what is inside:
                                workspace, home, logs/agent, logs/verifier with the
                                verifier's reward.txt / reward.json as written, outputs)
OUT/rollouts/ROLLOUT/result.json    how it ended and its reward (a :class:`RolloutOutcome`)
OUT/summary.json, summary.csv   one row per rollout (its last attempt)
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from orchestrator.backend import Verified
from orchestrator.plan import PlannedRollout
from schemas.enums import RolloutPhase


class Status(StrEnum):
    """How the orchestrator's work on a rollout ended: the outcome of its last attempt.

    Not a :class:`~schemas.enums.RolloutPhase`, which is one step of one attempt's lifecycle in
    the event log: a status sums up a rollout over its attempts. Where the two meet they are one
    word: ``verified`` and ``infra_failed`` are the last phase the event log has for that attempt.
    ``cancelled`` has no phase: a cancelled rollout's events stop wherever it was cancelled.
    """

    VERIFIED = RolloutPhase.VERIFIED.value  # the agent ran (however it ended), then was scored
    INFRA_FAILED = RolloutPhase.INFRA_FAILED.value  # every attempt failed, none by the agent
    CANCELLED = "cancelled"  # the run was cancelled (or stopped) before it was verified


@dataclass(frozen=True)
class RolloutOutcome:
    """How one rollout of a run ended (its last attempt): its ``result.json``, its summary row."""

    rollout_id: str
    task_id: str
    group_id: str
    sample: int
    attempt: int
    status: Status
    agent_phase: str | None = None  # finished | failed | timed_out
    exit_code: int | None = None
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    agent_s: float | None = None
    verifier_s: float | None = None
    message: str = ""
    wall_s: float | None = None  # the attempt, from registration to the recorded reward
    calls: int | None = None  # the model calls the proxy recorded for the attempt
    ready_s: float | None = None  # from the attempt's start to its first model call

    @classmethod
    def verified(
        cls,
        p: PlannedRollout,
        rollout_id: str,
        attempt: int,
        v: Verified,
        wall_s: float,
        calls: int | None = None,
        ready_s: float | None = None,
    ) -> RolloutOutcome:
        return cls(
            rollout_id,
            p.task.id,
            p.group_id,
            p.sample,
            attempt,
            Status.VERIFIED,
            v.agent.phase.value,
            v.agent.exit_code,
            v.reward.reward,
            dict(v.reward.components),
            round(v.agent.duration_s, 3),
            round(v.verifier_duration_s, 3),
            v.agent.message,
            round(wall_s, 4),
            calls,
            None if ready_s is None else round(ready_s, 4),
        )

    @classmethod
    def infra_failed(
        cls, p: PlannedRollout, rollout_id: str, attempt: int, why: str
    ) -> RolloutOutcome:
        return cls(
            rollout_id, p.task.id, p.group_id, p.sample, attempt, Status.INFRA_FAILED, message=why
        )

    @classmethod
    def cancelled(cls, p: PlannedRollout, rollout_id: str) -> RolloutOutcome:
        return cls(rollout_id, p.task.id, p.group_id, p.sample, 0, Status.CANCELLED)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutOutcome:
        """The outcome a ``result.json`` holds (keys of other versions are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        return cls(**{**values, "status": Status(values["status"])})


class RunDir:
    """The directory ``root`` of one orchestrator job."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "rollouts").mkdir(parents=True, exist_ok=True)

    @classmethod
    def found_in(cls, path: Path) -> list[RunDir]:
        """The job directories ``path`` holds: ``path`` itself (``openforge rollouts run
        --out``) and those a training run keeps under it (``rollouts/`` and ``eval/``)."""
        kept = [root for root in (path / "rollouts", path / "eval") if (root / "rollouts").is_dir()]
        roots = kept or ([path] if (path / "rollouts").is_dir() else [])
        return [cls(root) for root in roots]

    def rollout_root(self, rollout_id: str) -> Path:
        return self.root / "rollouts" / rollout_id

    def write_outcome(self, outcome: RolloutOutcome) -> None:
        path = self.rollout_root(outcome.rollout_id)
        path.mkdir(parents=True, exist_ok=True)
        (path / "result.json").write_text(json.dumps(asdict(outcome), indent=2) + "\n")

    def outcomes(self, prefix: str = "") -> list[RolloutOutcome]:
        """The ``result.json`` outcomes written so far (a rollout's last attempt, once verified
        or given up) whose rollout id starts with ``prefix``, by rollout id."""
        paths = sorted((self.root / "rollouts").glob(f"{prefix}*/result.json"))
        return [RolloutOutcome.from_json(json.loads(p.read_text())) for p in paths]

    def write_summary(self, outcomes: Sequence[RolloutOutcome]) -> None:
        rows = sorted((asdict(r) for r in outcomes), key=lambda r: r["rollout_id"])
        (self.root / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
        fields = [f for f in RolloutOutcome.__dataclass_fields__ if f != "components"]
        with open(self.root / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
