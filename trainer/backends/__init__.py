"""Trainer backends behind one interface: the CPU reference (``cpu``) and veRL's FSDP engine
(``verl``)."""

from __future__ import annotations

from pathlib import Path

from schemas.errors import ConfigError
from trainer.backends.base import TrainerBackend

BACKENDS = ("cpu", "verl")


def make_backend(
    name: str, model_dir: Path, lora_rank: int | None, lr: float, seed: int = 0
) -> TrainerBackend:
    """The backend called ``name`` for ``model_dir`` (LoRA of ``lora_rank``, or full weights)."""
    if name == "cpu":
        from trainer.backends.cpu import CPUBackend

        return CPUBackend(model_dir, lora_rank=lora_rank, lr=lr, seed=seed)
    if name == "verl":
        from trainer.backends.verl_fsdp import VerlBackend, VerlConfig

        return VerlBackend(model_dir, VerlConfig(lr=lr, lora_rank=lora_rank or 0), seed=seed)
    raise ConfigError(f"unknown trainer backend {name!r}: choose one of {', '.join(BACKENDS)}")
