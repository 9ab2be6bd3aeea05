"""Episode: the trainer-ready unit assembled from one rollout's events.

An episode is a tree of samples. A sample is one token sequence: calls whose prompt extends the
previous call's prompt + completion merge into one sample; where the history diverges, a new
sample starts, linked to its parent, with the mismatch class recorded as a fork.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from schemas.completion import POLICY_SPAN, PolicySpan
from schemas.enums import ContinuityClass

# Fixed namespace: episode ids are uuid5(namespace, rollout id), the same on every replay.
EPISODE_NAMESPACE = uuid.UUID("0f0a4c4e-6f70-4e46-9f72-67652d657069")


def episode_id_for(rollout_id: str) -> str:
    """The deterministic episode id of a rollout."""
    return str(uuid.uuid5(EPISODE_NAMESPACE, rollout_id))


@dataclass(frozen=True, slots=True)
class Sample:
    """One token sequence of an episode, aligned position by position.

    ``loss_mask`` is 1 on generated tokens and 0 on prompt and tool tokens;
    ``behavior_logprobs`` holds the engine's logprob on generated tokens and 0.0 elsewhere;
    ``policy_versions`` covers the generated spans, in sequence positions; ``image_ids`` names
    the images its tokens hold placeholders for, in order (SHA-256 of the bytes, as in the
    completion events: :mod:`infra.image_store`), empty for a text-only sample.
    """

    index: int
    token_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    policy_versions: list[PolicySpan] = field(default_factory=list)
    parent_index: int | None = None  # the sample this one forked from
    fork_class: ContinuityClass = ContinuityClass.FIRST
    event_ids: list[str] = field(default_factory=list)  # the calls merged into this sample
    image_ids: list[str] = field(default_factory=list)  # v3: its prompt's images, in order


@dataclass(frozen=True, slots=True)
class Fork:
    """Where a new sample split off: at which call, from which sample, and why."""

    sample_index: int
    parent_index: int | None
    call_index: int
    mismatch: ContinuityClass
    common_prefix: int  # tokens shared with the parent sample


@dataclass(frozen=True, slots=True)
class Episode:
    episode_id: str
    rollout_id: str
    samples: list[Sample]
    reward: float | None  # None only for dead-lettered episodes
    created_us: int
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    forks: list[Fork] = field(default_factory=list)
    lineage: list[str] = field(default_factory=list)  # event ids it was assembled from
    dead_letter: str | None = None  # v2: why the episode is not trainable (e.g. no reward)
    schema_version: int = 3

    SCHEMA_NAME = "episode"


# The dead-letter reason of an attempt that failed for infrastructure reasons and was played
# again (``schemas.rollout.RETRIED``): its retry is the group's member, not this one.
SUPERSEDED = "infrastructure failure, retried as a new attempt"


def superseded(episode: Episode) -> bool:
    """Whether ``episode`` is the dead letter of an attempt that a retry replaced."""
    return (episode.dead_letter or "").startswith(SUPERSEDED)


SAMPLE = pa.struct(
    [
        pa.field("index", pa.int32(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("policy_versions", pa.list_(POLICY_SPAN), nullable=False),
        pa.field("parent_index", pa.int32()),
        pa.field("fork_class", pa.string(), nullable=False),
        pa.field("event_ids", pa.list_(pa.string()), nullable=False),
        pa.field("image_ids", pa.list_(pa.string()), nullable=False),  # added in v3
    ]
)

FORK = pa.struct(
    [
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("parent_index", pa.int32()),
        pa.field("call_index", pa.int32(), nullable=False),
        pa.field("mismatch", pa.string(), nullable=False),
        pa.field("common_prefix", pa.int32(), nullable=False),
    ]
)

EPISODE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("samples", pa.list_(SAMPLE), nullable=False),
        pa.field("reward", pa.float64()),
        pa.field("created_us", pa.int64(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("harness", pa.string()),
        pa.field("reward_components", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("forks", pa.list_(FORK), nullable=False),
        pa.field("lineage", pa.list_(pa.string()), nullable=False),
        pa.field("dead_letter", pa.string()),  # added in v2
    ]
)
