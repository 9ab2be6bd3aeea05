"""The CPU reference backend: a transformers model (full weights or a peft LoRA adapter), AdamW,
gradient accumulation, and veRL's losses and rollout correction.

One update per batch: ``old_logprobs`` are the trainer's own logprobs before the update (so the
PPO ratio starts at 1), and the distance to the engine's behavior logprobs is corrected by veRL's
rollout-correction weights (token-level truncated IS by default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.algorithms import AlgorithmConfig, compute_advantages, policy_loss, rollout_correction
from trainer.backends.base import TrainerBackend
from trainer.batch import TrainBatch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


class CPUBackend(TrainerBackend):
    def __init__(
        self,
        model_dir: Path,
        lora_rank: int | None = 8,
        lr: float = 1e-3,
        micro_batch: int = 8,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.lora = lora_rank is not None
        if lora_rank is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora_rank,
                    lora_alpha=2 * lora_rank,
                    target_modules=LORA_TARGETS,
                    lora_dropout=0.0,
                    bias="none",
                    init_lora_weights=True,
                ),
            )
        self.model = model
        self.micro_batch = micro_batch
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=lr)

    def _logprobs(self, batch: TrainBatch, rows: slice) -> torch.Tensor:
        ids = batch.input_ids[rows]
        logits = self.model(input_ids=ids, attention_mask=batch.attention_mask[rows]).logits
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
        old = self.logprobs(batch)
        mask = batch.response_mask
        advantages = compute_advantages(algo, batch.token_level_rewards, mask, batch.index)
        is_weights, corr_mask, metrics = rollout_correction(
            algo, old, batch.behavior_logprobs, mask
        )
        self.model.train()
        self.optimizer.zero_grad()
        total_tokens = float(corr_mask.sum().clamp(min=1))
        losses = []
        for i in range(0, batch.size, self.micro_batch):
            rows = slice(i, i + self.micro_batch)
            new = self._logprobs(batch, rows)
            loss, loss_metrics = policy_loss(
                algo,
                old[rows],
                new,
                advantages[rows],
                corr_mask[rows],
                None if is_weights is None else is_weights[rows],
            )
            # token-mean per micro-batch, re-weighted to a token-mean over the whole batch
            weight = float(corr_mask[rows].sum()) / total_tokens
            (loss * weight).backward()
            losses.append(loss.item() * weight)
            for k, v in loss_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], 1.0
        )
        self.optimizer.step()
        metrics.update(
            {"actor/pg_loss": sum(losses), "actor/grad_norm": float(grad_norm)},
            **batch.metrics(old),
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
            from transformers import AutoModelForCausalLM

            state = AutoModelForCausalLM.from_pretrained(str(directory / "model")).state_dict()
            self.model.load_state_dict(state)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))

    def export_for_inference(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory))
        return directory
