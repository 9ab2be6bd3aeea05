"""Harbor tasks: the task model, the task and dataset loader, and the verifier's reward files."""

from __future__ import annotations

from infra.tasks import harbor
from infra.tasks.loader import (
    dataset_entries,
    load_dataset,
    load_task,
    parse_task_toml,
    read_manifest,
)
from infra.tasks.model import (
    AgentSettings,
    EnvironmentSettings,
    Split,
    Task,
    TaskMetadata,
    VerifierSettings,
)
from infra.tasks.reward import VerifierReward, read_reward

__all__ = [
    "AgentSettings",
    "EnvironmentSettings",
    "Split",
    "Task",
    "TaskMetadata",
    "VerifierReward",
    "VerifierSettings",
    "dataset_entries",
    "harbor",
    "load_dataset",
    "load_task",
    "parse_task_toml",
    "read_manifest",
    "read_reward",
]
