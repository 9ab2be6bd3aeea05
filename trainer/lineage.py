"""The trainer's lineage: one ``step`` record per update in the run's archive (``schemas.step``).

Each record names the episodes the update trained on (with their rollouts, tasks, groups,
rewards, the policy versions of their tokens and the event-log offsets they were read at), the
policy version its weights were served as and its metrics. It is written after the update and
its weight sync and before its checkpoint, durably (the file and its directory entry are on disk
before training goes on; a file appears whole or not at all), so a crash loses no step that a
checkpoint covers; a step redone after a restart is written again, later, and the latest record
of a step is the one that counts (``openforge query``'s ``steps`` view).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas.archive import ArchiveWriter
from schemas.episode import Episode
from schemas.step import ConsumedEpisode, TrainingStep
from trainer.stream import Position


def consumed_episode(episode: Episode, position: Position | None) -> ConsumedEpisode:
    """What the lineage keeps of one episode of a batch, and where it was read."""
    versions = sorted({s.version for sample in episode.samples for s in sample.policy_versions})
    (topic, partition), offset = position if position is not None else ((None, None), None)
    return ConsumedEpisode(
        episode_id=episode.episode_id,
        rollout_id=episode.rollout_id,
        task_id=episode.task_id,
        group_id=episode.group_id,
        reward=episode.reward,
        policy_versions=versions,
        topic=topic,
        partition=partition,
        offset=offset,
    )


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers, as floats (what metrics.csv keeps too; NaN stays NaN)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def step_record(
    step: int,
    policy_version: int,
    episodes: Sequence[Episode],
    positions: Sequence[Position | None],
    metrics: Mapping[str, Any],
    at_us: int | None = None,
) -> TrainingStep:
    return TrainingStep(
        step=step,
        at_us=time.time_ns() // 1000 if at_us is None else at_us,
        policy_version=policy_version,
        episodes=[consumed_episode(e, p) for e, p in zip(episodes, positions, strict=True)],
        metrics=numeric(metrics),
    )


class StepArchive:
    """Writes step records to the archive root ``root``, durably (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.writer = ArchiveWriter(Path(root), durable=True)

    def write(self, record: TrainingStep) -> Path:
        (path,) = self.writer.write([record])
        return path
