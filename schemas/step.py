"""TrainingStep: the lineage of one trainer update, what it consumed and what it measured.

One record per update the trainer made: the episodes of its batch (each with its rollout, task,
group, reward, the policy versions that generated its tokens and where in the event log the
trainer read it), the policy version its weights were served as, and its metrics (loss, reward
mean, KL, importance-weight statistics: every number the update reported). A resumed trainer
redoes the updates after its last checkpoint and writes their records again, later: of several
records of one step, the latest is the step that happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class ConsumedEpisode:
    """One episode an update trained on, and where the trainer read it."""

    episode_id: str
    rollout_id: str
    task_id: str | None = None
    group_id: str | None = None
    reward: float | None = None
    policy_versions: list[int] = field(default_factory=list)  # of its tokens, distinct, ascending
    # The event-log position it was read at (None for an archive source: it has no offsets).
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class TrainingStep:
    step: int  # the update's number, 1-based
    at_us: int  # when the update was done (its weights served), microseconds since the epoch
    policy_version: int  # the version the update's weights were served as
    episodes: list[ConsumedEpisode] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. {"reward/mean": 0.5}
    schema_version: int = 1

    SCHEMA_NAME = "step"


CONSUMED_EPISODE = pa.struct(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("policy_versions", pa.list_(pa.int64()), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
    ]
)

STEP_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("at_us", pa.int64(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("episodes", pa.list_(CONSUMED_EPISODE), nullable=False),
        pa.field("metrics", pa.map_(pa.string(), pa.float64()), nullable=False),
    ]
)
