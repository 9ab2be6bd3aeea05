"""Supervised fine-tuning of a whole model on token sequences: a warm start.

    examples = lambda rng, n: [(prompt_ids, completion_ids), ...]   # one batch, freshly drawn
    fine_tune(model_dir, out_dir, examples, SFTConfig(steps=400))

An example is a (prompt, completion) pair of token ids, or a :class:`Masked` sequence (token ids
and a loss mask, as an episode's sample has them: several completions in one sequence). The loss
is the mean cross-entropy over completion (masked) tokens only; the rest is context.

A batch whose sequences share a long common prefix (a harness's system prompt and tools, the
same in every rollout) runs that prefix once: its keys and values, computed with gradients, are
repeated for every row and the rows' suffixes attend to them (:func:`sequence_loss`). The loss
and its gradients are those of the full sequences (``tests/trainer/test_sft.py``), at a fraction
of the cost for prompts of thousands of tokens.

The result is a Hugging Face directory (weights and tokenizer) that vLLM can serve and the RL
trainer can start from. Deterministic for a seed on one machine.
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
SHARED_PREFIX_MIN = 64  # a common prefix shorter than this is not run once on its own


@dataclass(frozen=True)
class Masked:
    """A token sequence and its loss mask (1: a completion token, trained on)."""

    ids: Sequence[int]
    mask: Sequence[int]

    @classmethod
    def of(cls, example: Example | Masked) -> Masked:
        if isinstance(example, Masked):
            return example
        prompt, completion = example
        return cls([*prompt, *completion], [0] * len(prompt) + [1] * len(completion))


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
    draw: Callable[[random.Random, int], Sequence[Example | Masked]],
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
        loss = sequence_loss(model, [Masked.of(e) for e in draw(rng, cfg.batch)])
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


def shared_prefix(batch: Sequence[Masked]) -> int:
    """How many leading tokens every row shares and none is trained on (the logit that predicts
    a row's first trained token comes after them)."""
    first = batch[0].ids
    n = min(len(e.ids) for e in batch)
    for e in batch[1:]:
        n = next((i for i in range(n) if e.ids[i] != first[i]), n)
    trained = min(next((i for i, m in enumerate(e.mask) if m), len(e.ids)) for e in batch)
    return max(0, min(n, trained - 1))


def sequence_loss(model: Any, batch: Sequence[Masked]) -> Any:
    """Mean cross-entropy over the masked tokens of ``batch``; a shared prefix of at least
    :data:`SHARED_PREFIX_MIN` tokens runs once (its keys and values, with gradients, repeated
    for every row), which gives the same loss and gradients as the full rows."""
    import torch

    if not batch:
        raise ConfigError("an SFT batch is empty: the data generator returned no examples")
    p = shared_prefix(batch)
    if p < SHARED_PREFIX_MIN:
        p = 0
    cache = None
    if p:
        prefix = torch.tensor([list(batch[0].ids[:p])])
        cache = model(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
    ids, attention, labels = _tensors([Masked(e.ids[p:], e.mask[p:]) for e in batch])
    rows, width = ids.shape
    attention = torch.cat([torch.ones(rows, p, dtype=attention.dtype), attention], dim=1)
    positions = (p + torch.arange(width)).unsqueeze(0).expand(rows, -1)
    logits = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache
    ).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
    )


def _tensors(batch: Sequence[Masked]) -> tuple[Any, Any, Any]:
    """Right-padded input ids, attention mask, and labels (-100 outside the masked tokens)."""
    import torch

    length = max(len(e.ids) for e in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    attention = torch.zeros(len(batch), length, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    for row, e in enumerate(batch):
        seq = torch.tensor(list(e.ids), dtype=torch.long)
        ids[row, : len(seq)] = seq
        attention[row, : len(seq)] = 1
        trained = torch.tensor(list(e.mask), dtype=torch.bool)
        labels[row, : len(seq)] = torch.where(trained, seq, torch.full_like(seq, -100))
    return ids, attention, labels
