"""RewardEvent: a rollout's scalar reward, its named components and who judged it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class RewardEvent:
    event_id: str
    rollout_id: str
    reward: float
    at_us: int  # microseconds since the Unix epoch
    task_id: str | None = None
    components: dict[str, float] = field(default_factory=dict)  # e.g. {"tests": 1.0}
    verifier: str | None = None  # identity of the verifier (name@version, or "user")
    verifier_output: str | None = None  # its log or explanation
    # The version of the verifier that scored it: None for the score recorded when the rollout
    # ran; N for a re-score (``openforge replay rescore``). The reward join prefers the highest.
    verifier_version: int | None = None
    schema_version: int = 2  # v2: verifier_version

    SCHEMA_NAME = "reward"


REWARD_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("at_us", pa.int64(), nullable=False),
        pa.field("task_id", pa.string()),
        pa.field("components", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("verifier", pa.string()),
        pa.field("verifier_output", pa.large_string()),
        pa.field("verifier_version", pa.int32()),
    ]
)
