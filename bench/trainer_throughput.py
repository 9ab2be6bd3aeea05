"""Trainer throughput (tokens/s): our CPU backend vs a plain transformers + peft loop, one batch.

    .venv/bin/python -m bench.trainer_throughput [--steps 8] [--rows 16] [--prompt 192]
        [--generated 320] [--models tiny small]

Both sides load the same model directory with the same seed, wrap it in the same peft LoRA
(rank 8, alpha 16, q/k/v/o projections), use AdamW at the same learning rate with gradient
clipping at 1.0 and micro-batches of 8 rows, and train on the same batch (``rows`` samples of
``prompt`` + ``generated`` tokens, 4 samples per task, random rewards). Ours is
``CPUBackend.train_step`` as ``trainer.loop`` calls it (GRPO advantages, veRL's token-level
truncated IS against the behavior logprobs, veRL's PPO-clip loss); proof of path: its metrics
(``rollout_corr/...``, ``actor/pg_clipfrac``, ``data/tokens``) come back from veRL's functions.
The plain loop is what one writes by hand: forward, log-softmax, a token-mean policy-gradient
loss with the same advantages, backward, clip, step. Steps alternate between the two after one
warm-up step each; tokens/s = the batch's tokens / median step time, and the ratio is the median
of the ratios of adjacent steps (so that load from elsewhere on a shared machine, which comes
and goes, falls on both sides of a pair).

Models: ``tiny`` is the test suite's model (~0.4 M parameters, where fixed per-step costs show),
``small`` the same architecture at hidden 512, 4 layers (~14 M parameters).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infra.paths import default_tiny_dir
from infra.tiny_model import TinyModelSpec, build_tiny_model
from schemas.episode import Episode, Sample
from trainer.algorithms import AlgorithmConfig, compute_advantages
from trainer.backends.cpu import LORA_TARGETS, CPUBackend
from trainer.batch import TrainBatch, to_batch

MODELS = {
    "tiny": TinyModelSpec(),
    "small": TinyModelSpec(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8
    ),
}
LR, RANK, MICRO = 1e-4, 8, 8


def episodes(rows: int, prompt: int, generated: int, vocab: int, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        tokens = rng.integers(10, vocab, size=prompt + generated).tolist()
        mask = [0] * prompt + [1] * generated
        logprobs = [float(-rng.uniform(1, 8)) if m else 0.0 for m in mask]
        out.append(
            Episode(
                f"e{i}",
                f"r{i}",
                [Sample(0, tokens, mask, logprobs)],
                float(rng.integers(0, 2)),
                0,
                task_id=f"task{i // 4}",
            )
        )
    return out


class PlainLoop:
    """transformers + peft + AdamW, written by hand."""

    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model: Any = get_peft_model(
            model,
            LoraConfig(
                r=RANK,
                lora_alpha=2 * RANK,
                target_modules=LORA_TARGETS,
                lora_dropout=0.0,
                bias="none",
            ),
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=LR)

    def step(self, batch: TrainBatch, advantages: torch.Tensor) -> float:
        self.model.train()
        self.optimizer.zero_grad()
        total = float(batch.response_mask.sum())
        loss_sum = 0.0
        for i in range(0, batch.size, MICRO):
            ids = batch.input_ids[i : i + MICRO]
            logits = self.model(
                input_ids=ids, attention_mask=batch.attention_mask[i : i + MICRO]
            ).logits
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            logp = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            mask = batch.response_mask[i : i + MICRO]
            loss = -(advantages[i : i + MICRO] * logp * mask).sum() / total
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        return loss_sum


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    spec = MODELS[name]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = (
            build_tiny_model(default_tiny_dir(0), seed=0)
            if name == "tiny"
            else build_tiny_model(Path(tmp) / name, seed=0, spec=spec)
        )
        ours = CPUBackend(model_dir, lora_rank=RANK, lr=LR, micro_batch=MICRO, seed=0)
        plain = PlainLoop(model_dir, seed=0)
        vocab = int(ours.model.config.vocab_size)
        batch = to_batch(episodes(args.rows, args.prompt, args.generated, vocab))
        algo = AlgorithmConfig()
        advantages = compute_advantages(
            algo, batch.token_level_rewards, batch.response_mask, batch.index
        )
        times: dict[str, list[float]] = {"ours": [], "plain": []}
        metrics: dict[str, Any] = {}
        for step in range(args.steps + 1):
            for side in ("ours", "plain") if step % 2 == 0 else ("plain", "ours"):
                t0 = time.perf_counter()
                if side == "ours":
                    metrics = ours.train_step(batch, algo)
                else:
                    plain.step(batch, advantages)
                if step:  # the first step of each is warm-up
                    times[side].append(time.perf_counter() - t0)
    params = sum(p.numel() for p in ours.model.parameters())
    for key in ("rollout_corr/rollout_is_mean", "actor/pg_clipfrac", "data/tokens"):
        assert key in metrics, (key, sorted(metrics))  # veRL's functions ran
    tokens = batch.tokens()
    ours_s, plain_s = statistics.median(times["ours"]), statistics.median(times["plain"])
    return {
        "model": name,
        "params": params,
        "tokens": tokens,
        "ours_s": ours_s,
        "plain_s": plain_s,
        "ratio": statistics.median(
            p / o for p, o in zip(times["plain"], times["ours"], strict=True)
        ),
        "ours_min": min(times["ours"]),
        "plain_min": min(times["plain"]),
        "metric_tokens": metrics["data/tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=192)
    parser.add_argument("--generated", type=int, default=320)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"batch: {args.rows} rows x ({args.prompt} prompt + {args.generated} generated) tokens, "
        f"micro-batches of {MICRO}, LoRA rank {RANK}, AdamW lr {LR}, {args.steps} timed steps "
        f"each, {args.threads} torch thread(s)\n"
    )
    print(
        "| model | parameters | tokens/step | path | step s (median / min) | tokens/s "
        "| ours / plain |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = measure(name, args)
        for side, label in (("plain", "plain transformers + peft loop"), ("ours", "CPUBackend")):
            s = r[f"{side}_s"]
            ratio = f"{r['ratio']:.2f}x" if side == "ours" else "-"
            print(
                f"| {name} | {r['params']:,} | {r['tokens']:,} | {label} | {s:.3f} / "
                f"{r[f'{side}_min']:.3f} | "
                f"{r['tokens'] / s:,.0f} | {ratio} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
