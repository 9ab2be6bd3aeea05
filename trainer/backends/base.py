"""The trainer-backend interface."""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import torch

from trainer.algorithms import AlgorithmConfig
from trainer.batch import TrainBatch


class TrainerBackend(abc.ABC):
    device: str = "cpu"  # where the updates run: cpu or cuda (the step records say which)

    @abc.abstractmethod
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """The current policy's logprob of each next token, ``[B, T-1]`` (no gradient)."""

    @abc.abstractmethod
    def train_step(self, batch: TrainBatch, algo: AlgorithmConfig) -> dict[str, Any]:
        """One off-policy-corrected update on ``batch``; returns namespaced metrics."""

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Weights (or adapter) and optimizer state."""

    @abc.abstractmethod
    def load(self, directory: Path) -> None: ...

    @abc.abstractmethod
    def export_for_inference(self, directory: Path) -> Path:
        """Write what the inference server loads (a LoRA adapter or full weights)."""
