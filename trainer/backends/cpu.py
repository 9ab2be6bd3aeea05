"""The CPU reference backend: a transformers model (full weights or a peft LoRA adapter), AdamW,
gradient accumulation, and veRL's losses and rollout correction.

One update per batch: ``old_logprobs`` are the trainer's own logprobs before the update (so the
PPO ratio starts at 1), taken from the training forward pass itself (from a no-grad eval pass
first when the model has dropout), and the distance to the
engine's behavior logprobs is corrected by veRL's rollout-correction weights (token-level
truncated IS by default).

A vision-language model (a ``vision_config`` in its config: Idefics3's architecture, the tiny
VLM's) trains on samples with images: each such row's forward pass gets the pixel values of its
images, read from the proxy's image store and processed as the engine did
(:mod:`trainer.pixels`); LoRA then adapts the text model's attention only. A text model refuses
a sample with images (its logprobs would ignore the pixels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from infra.image_store import ImageStore
from schemas.errors import ConfigError
from trainer.algorithms import AlgorithmConfig, compute_advantages, policy_loss, rollout_correction
from trainer.backends.base import TrainerBackend
from trainer.batch import TrainBatch
from trainer.pixels import Pixels, is_vision_model, merged_embeddings

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
VISION_LORA_TARGETS = r".*text_model.*\.(q_proj|k_proj|v_proj|o_proj)"  # not the vision tower


def _has_dropout(model: Any) -> bool:
    """Whether any dropout is active in training mode: a dropout module, or a config's
    ``*dropout*`` rate (attention dropout is functional in Transformers' models)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = vars(config).items() if config is not None else ()
    return any("dropout" in k and isinstance(v, int | float) and v > 0 for k, v in rates)


class CPUBackend(TrainerBackend):
    def __init__(
        self,
        model_dir: Path,
        lora_rank: int | None = 8,
        lr: float = 1e-3,
        micro_batch: int = 8,
        seed: int = 0,
        images: ImageStore | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        torch.manual_seed(seed)
        vision = is_vision_model(model_dir)
        self.pixels = Pixels(model_dir, images) if vision else None
        loader: Any = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        self._loader = loader
        model: Any = loader.from_pretrained(str(model_dir), dtype=torch.float32)
        self.lora = lora_rank is not None
        if lora_rank is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora_rank,
                    lora_alpha=2 * lora_rank,
                    target_modules=VISION_LORA_TARGETS if vision else LORA_TARGETS,
                    lora_dropout=0.0,
                    bias="none",
                    init_lora_weights=True,
                ),
            )
        self.model = model
        self.micro_batch = micro_batch
        # With dropout the training pass is not the pre-update policy: then ``old_logprobs``
        # come from a no-grad pass in eval mode first (see train_step).
        self.dropout = _has_dropout(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr)

    def _logprobs(self, batch: TrainBatch, rows: slice) -> torch.Tensor:
        indices = range(batch.size)[rows]
        if not any(batch.images_of(i) for i in indices):
            return self._forward(batch.input_ids[rows], batch.attention_mask[rows])
        # Rows with images: one forward pass each, the images' features in that row's prompt.
        return torch.cat([self._forward_with_images(batch, i) for i in indices])

    def _forward_with_images(self, batch: TrainBatch, row: int) -> torch.Tensor:
        ids, attention = batch.input_ids[row : row + 1], batch.attention_mask[row : row + 1]
        image_ids = batch.images_of(row)
        if not image_ids:
            return self._forward(ids, attention)
        generated = torch.zeros_like(ids, dtype=torch.bool)
        generated[0, 1:] = batch.response_mask[row] > 0
        embeds = merged_embeddings(
            self.model, ids, ~generated & (attention > 0), self._pixels(image_ids)
        )
        return self._forward(ids, attention, embeds)

    def _pixels(self, image_ids: list[str]) -> dict[str, torch.Tensor]:
        if self.pixels is None:
            raise ConfigError(
                "a sample has images but the policy is a text model: train a vision-language "
                "model on screenshot rollouts (its logprobs would ignore the pixels)"
            )
        return self.pixels.of(image_ids)

    def _forward(
        self, ids: torch.Tensor, attention: torch.Tensor, embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logprobs of ``ids[:, 1:]``; the input is ``embeds`` when given (images merged in)."""
        if embeds is None:
            logits = self.model(input_ids=ids, attention_mask=attention).logits
        else:
            logits = self.model(inputs_embeds=embeds, attention_mask=attention).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad():
            return torch.cat(
                [
                    self._logprobs(batch, slice(i, i + self.micro_batch))
                    for i in range(0, batch.size, self.micro_batch)
                ]
            )

    def train_step(self, batch: TrainBatch, algo: AlgorithmConfig) -> dict[str, Any]:
        """One update, in one forward and backward pass per micro-batch.

        There is one update per batch, so the weights of the training forward pass are the
        weights before the update: its logprobs, detached, are ``old_logprobs`` (the PPO ratio
        starts at 1), with no separate no-grad pass. (Our models have no dropout: Qwen2's
        attention dropout is 0, and so is the LoRA dropout.) The rollout-correction weights and
        masks are per token and per sequence, so computing them per micro-batch gives the
        batch's; each micro-batch's token-mean loss is scaled by its token count and the
        gradient divided by the batch's, a token-mean over the whole batch.
        """
        mask = batch.response_mask
        advantages = compute_advantages(algo, batch.token_level_rewards, mask, batch.index)
        separate = self.logprobs(batch) if self.dropout else None
        self.model.train()
        self.optimizer.zero_grad()
        olds: list[torch.Tensor] = []
        total_tokens, pg_loss = 0.0, 0.0
        loss_sums: dict[str, float] = {}
        for i in range(0, batch.size, self.micro_batch):
            rows = slice(i, i + self.micro_batch)
            new = self._logprobs(batch, rows)
            old = new.detach() if separate is None else separate[rows]
            olds.append(old)
            if not mask[rows].any():  # nothing generated here: no loss (veRL refuses it)
                continue
            is_weights, corr_mask, _ = rollout_correction(
                algo, old, batch.behavior_logprobs[rows], mask[rows]
            )
            loss, loss_metrics = policy_loss(
                algo, old, new, advantages[rows], corr_mask, is_weights
            )
            tokens = float(corr_mask.sum())
            (loss * tokens).backward()
            total_tokens += tokens
            pg_loss += loss.item() * tokens
            for k, v in loss_metrics.items():
                loss_sums[k] = loss_sums.get(k, 0.0) + float(v) * tokens
        total_tokens = max(total_tokens, 1.0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is not None:
                p.grad.div_(total_tokens)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        self.optimizer.step()
        old_all = torch.cat(olds)
        # the batch's correction metrics, as veRL reports them over the whole batch
        _, _, metrics = rollout_correction(algo, old_all, batch.behavior_logprobs, mask)
        metrics.update({k: v / total_tokens for k, v in loss_sums.items()})
        metrics.update(
            {"actor/pg_loss": pg_loss / total_tokens, "actor/grad_norm": float(grad_norm)},
            **batch.metrics(old_all),
        )
        return metrics

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory / "model"))
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        if self.lora:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(
                self.model, load_file(str(directory / "model" / "adapter_model.safetensors"))
            )
        else:
            state = self._loader.from_pretrained(str(directory / "model")).state_dict()
            self.model.load_state_dict(state)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))

    def export_for_inference(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory))
        return directory
