"""Supervised fine-tuning of a whole model on (prompt, completion) token pairs: a warm start.

    examples = lambda rng: [(prompt_ids, completion_ids), ...]   # one batch, freshly drawn
    fine_tune(model_dir, out_dir, examples, SFTConfig(steps=400))

The loss is the mean cross-entropy over completion tokens only (prompt tokens are context). The
result is a Hugging Face directory (weights and tokenizer) that vLLM can serve and the RL trainer
can start from. Deterministic for a seed on one machine.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError

Example = tuple[Sequence[int], Sequence[int]]  # (prompt token ids, completion token ids)


@dataclass(frozen=True)
class SFTConfig:
    """Attributes:
    steps: optimizer steps (0: copy the model unchanged).
    batch: examples per step.
    lr: AdamW learning rate (constant after a short warm-up).
    warmup: steps of linear learning-rate warm-up (0: none).
    clip_grad_norm: gradient-norm clipping (None: none; the echo-words warm start uses none,
        see bench/RESULTS.md).
    seed: draws of the data and the model's randomness.
    """

    steps: int = 400
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 0
    clip_grad_norm: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch < 1 or not self.lr > 0:
            raise ConfigError(f"SFT needs steps >= 0, batch >= 1 and lr > 0, not {self}")


def fine_tune(
    model_dir: Path,
    out_dir: Path,
    draw: Callable[[random.Random, int], list[Example]],
    cfg: SFTConfig,
    on_step: Callable[[int, float], None] | None = None,
    done: Callable[[Any], bool] | None = None,
    check_every: int = 50,
) -> Path:
    """Fine-tune ``model_dir`` on batches from ``draw(rng, batch)``; write it to ``out_dir``
    (through a temporary directory, so a half-written model is never left under that name).

    With ``done``, training stops early once ``done(model)`` is true (asked every
    ``check_every`` steps, with the model in eval mode and no gradients): ``cfg.steps`` is
    then the most it takes. Skills such as copying a token from the prompt appear abruptly
    after a number of steps that varies with the data and the machine; asking is robust where a
    fixed count is not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / max(cfg.warmup, 1))
    )
    model.train()
    for step in range(cfg.steps):
        batch = draw(rng, cfg.batch)
        ids, attention, labels = _tensors(batch)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad_norm)
        opt.step()
        sched.step()
        if on_step is not None:
            on_step(step + 1, float(loss.item()))
        if done is not None and (step + 1) % check_every == 0:
            model.eval()
            with torch.no_grad():
                finished = done(model)
            model.train()
            if finished:
                break
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{int(time.time() * 1000)}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(tmp))
    for extra in ("generation_config.json",):
        if (model_dir / extra).exists() and not (tmp / extra).exists():
            shutil.copy2(model_dir / extra, tmp / extra)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _tensors(batch: list[Example]) -> tuple[Any, Any, Any]:
    """Right-padded input ids, attention mask, and labels (-100 outside the completions)."""
    import torch

    if not batch:
        raise ConfigError("an SFT batch is empty: the data generator returned no examples")
    length = max(len(p) + len(c) for p, c in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    attention = torch.zeros(len(batch), length, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(batch):
        seq = [*prompt, *completion]
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        labels[row, len(prompt) : len(seq)] = torch.tensor(list(completion))
    return ids, attention, labels
