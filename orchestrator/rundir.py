"""A job's run directory: one folder per rollout attempt, and a summary at the end.

OUT/rollouts/ROLLOUT/           one attempt (see orchestrator.local for what is inside:
                                workspace, home, logs/agent, logs/verifier with the
                                verifier's reward.txt / reward.json as written, outputs)
OUT/rollouts/ROLLOUT/result.json    how it ended and its reward
OUT/summary.json, summary.csv   one row per rollout (its last attempt)
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from orchestrator.backend import Verified
from orchestrator.plan import PlannedRollout


class Status(StrEnum):
    VERIFIED = "verified"  # the agent ran (in whatever way it ended) and the verifier scored it
    INFRA_FAILED = "infra_failed"  # every attempt failed for infrastructure reasons
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RolloutRecord:
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

    @classmethod
    def verified(
        cls, p: PlannedRollout, rollout_id: str, attempt: int, v: Verified, wall_s: float
    ) -> RolloutRecord:
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
        )

    @classmethod
    def infra_failed(
        cls, p: PlannedRollout, rollout_id: str, attempt: int, why: str
    ) -> RolloutRecord:
        return cls(
            rollout_id, p.task.id, p.group_id, p.sample, attempt, Status.INFRA_FAILED, message=why
        )

    @classmethod
    def cancelled(cls, p: PlannedRollout, rollout_id: str) -> RolloutRecord:
        return cls(rollout_id, p.task.id, p.group_id, p.sample, 0, Status.CANCELLED)


class RunDir:
    """The directory ``root`` of one orchestrator job."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "rollouts").mkdir(parents=True, exist_ok=True)

    def rollout_root(self, rollout_id: str) -> Path:
        return self.root / "rollouts" / rollout_id

    def write_record(self, record: RolloutRecord) -> None:
        path = self.rollout_root(record.rollout_id)
        path.mkdir(parents=True, exist_ok=True)
        (path / "result.json").write_text(json.dumps(asdict(record), indent=2) + "\n")

    def write_summary(self, records: Sequence[RolloutRecord]) -> None:
        rows = sorted((asdict(r) for r in records), key=lambda r: r["rollout_id"])
        (self.root / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
        fields = [f for f in RolloutRecord.__dataclass_fields__ if f != "components"]
        with open(self.root / "summary.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
