"""Trainer backends behind one interface: the CPU reference (``cpu``) and veRL's FSDP engine
(``verl``). Each is registered as a factory that imports its heavy dependencies when called."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.registry import Registry

if TYPE_CHECKING:  # the backends import torch; naming one must stay cheap (the CLI does)
    from trainer.backends.base import TrainerBackend


class BackendName(StrEnum):
    CPU = "cpu"  # the reference: transformers + peft + AdamW, one process
    VERL = "verl"  # veRL's FSDP engine, one rank per GPU under torchrun


Factory = Callable[[Path, int | None, float, int, Path | None], "TrainerBackend"]
BACKENDS: Registry[Factory] = Registry("trainer backend")


@BACKENDS.register(BackendName.CPU)
def _cpu(
    model_dir: Path, lora_rank: int | None, lr: float, seed: int, image_dir: Path | None
) -> TrainerBackend:
    from infra.image_store import ImageStore
    from trainer.backends.cpu import CPUBackend

    images = ImageStore(image_dir) if image_dir is not None else None
    return CPUBackend(model_dir, lora_rank=lora_rank, lr=lr, seed=seed, images=images)


@BACKENDS.register(BackendName.VERL)
def _verl(
    model_dir: Path, lora_rank: int | None, lr: float, seed: int, image_dir: Path | None
) -> TrainerBackend:
    from trainer.backends.verl_fsdp import VerlBackend, VerlConfig

    return VerlBackend(model_dir, VerlConfig(lr=lr, lora_rank=lora_rank or 0), seed=seed)


def make_backend(
    name: str,
    model_dir: Path,
    lora_rank: int | None,
    lr: float,
    seed: int = 0,
    image_dir: Path | None = None,
) -> TrainerBackend:
    """The backend called ``name`` for ``model_dir`` (LoRA of ``lora_rank``, or full weights);
    ``image_dir``: the proxy's image store, for samples with images (the CPU backend's)."""
    return BACKENDS.get(name)(model_dir, lora_rank, lr, seed, image_dir)
