"""Smoke test of the veRL backend on a GPU machine (or CPU ranks): train, compare, export.

    torchrun --nproc_per_node=NGPUS -m trainer.gpu_smoke --out smoke.json
    torchrun --nproc_per_node=1 -m trainer.gpu_smoke --model /models/Qwen2.5-0.5B --param-dtype bf16

Builds the tiny model unless ``--model`` is given, makes synthetic episodes (groups of four per
task, rewards 0/1), and with veRL's FSDP engine:

1. scores them and compares with the CPU reference backend (transformers, fp32) on rank 0;
2. runs ``--steps`` off-policy-corrected updates (GRPO, truncated IS), timing each;
3. exports full weights in Hugging Face format and checks that transformers, loading them, scores
   like the engine.

Prints one JSON summary (rank 0) and exits 1 if a check fails. The same script runs on CPU ranks
(gloo), which is how the suite checks it without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from schemas.completion import PolicySpan
from schemas.episode import Episode, Sample
from trainer.algorithms import AlgorithmConfig
from trainer.backends.verl_fsdp import VerlBackend, VerlConfig
from trainer.batch import TrainBatch, to_batch


def synthetic_episodes(n: int, vocab: int, length: int = 48, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        tokens = rng.integers(10, vocab - 1, size=length).tolist()
        prompt = length // 2
        mask = [0] * prompt + [1] * (length - prompt)
        lps = [float(-rng.uniform(4, 7)) if m else 0.0 for m in mask]
        sample = Sample(0, tokens, mask, lps, [PolicySpan(0, prompt, length)])
        out.append(Episode(f"e{i}", f"r{i}", [sample], float(i % 2), 0, task_id=f"t{i // 4}"))
    return out


def reference_logprobs(model_dir: Path, batch: TrainBatch) -> torch.Tensor:
    from trainer.backends.cpu import CPUBackend

    return CPUBackend(model_dir, lora_rank=None).logprobs(batch)


def hf_logprobs(model_dir: Path, batch: TrainBatch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask].abs().max())


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", type=Path, help="HF model dir (default: build the tiny one)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--param-dtype", default="fp32", help="fp32 (tight checks) or bf16")
    parser.add_argument("--strategy", default="fsdp2")
    parser.add_argument("--tolerance", type=float, default=None, help="logprob check tolerance")
    parser.add_argument("--out", type=Path, help="write the JSON summary here too")
    return parser.parse_args(argv)


def _model_dir(given: Path | None) -> Path:
    """``given``, or the tiny model: built by rank 0, waited for by the other ranks."""
    if given is not None:
        return given
    from infra.paths import default_tiny_dir
    from infra.tiny_model import build_tiny_model

    model_dir = default_tiny_dir(0)
    if os.environ.get("RANK", "0") == "0":
        build_tiny_model(model_dir, seed=0)
    deadline = time.monotonic() + 300
    while not (model_dir / "openforge-tiny.json").exists():  # other ranks: wait for rank 0
        if time.monotonic() > deadline:
            raise SystemExit(f"the tiny model did not appear in {model_dir}")
        time.sleep(0.5)
    return model_dir


def _train(backend: VerlBackend, batch: TrainBatch, steps: int) -> list[dict[str, Any]]:
    """``steps`` updates on ``batch``, each timed, with its loss, gradient norm and IS weight."""
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        metrics = backend.train_step(batch, AlgorithmConfig())
        out.append(
            {
                "seconds": round(time.perf_counter() - t, 3),
                "pg_loss": metrics.get("actor/pg_loss"),
                "grad_norm": metrics.get("actor/grad_norm"),
                "is_weight_mean": metrics.get("rollout_corr/rollout_is_mean"),
            }
        )
    return out


def _export_diff(backend: VerlBackend, batch: TrainBatch, after: torch.Tensor) -> float | None:
    """The exported weights' largest logprob difference from the engine's (rank 0; others:
    None), exported into a directory rank 0 chose."""
    with tempfile.TemporaryDirectory(prefix="openforge-smoke-") as tmp:
        shared: list[Any] = [tmp]
        dist.broadcast_object_list(shared, src=0)
        export = backend.export_for_inference(Path(shared[0]) / "export")
        diff = None
        if backend.rank == 0:
            diff = max_diff(hf_logprobs(export, batch), after, batch.response_mask.bool())
        dist.barrier()
    return diff


def _finish(summary: dict[str, Any], out: Path | None, rank0: bool) -> int:
    """Rank 0 prints (and writes) the summary; every rank exits by rank 0's verdict."""
    ok = all(summary["checks"].values())
    if rank0:
        summary["ok"] = ok
        text = json.dumps(summary, indent=2)
        print(text)
        if out:
            out.write_text(text)
    ok_all: list[Any] = [ok]
    dist.broadcast_object_list(ok_all, src=0)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok_all[0] else 1


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    tol = args.tolerance or (2e-3 if args.param_dtype == "fp32" else 0.25)
    model_dir = _model_dir(args.model)
    t0 = time.perf_counter()
    backend = VerlBackend(
        model_dir,
        VerlConfig(strategy=args.strategy, lr=args.lr, param_dtype=args.param_dtype),
    )
    build_s = time.perf_counter() - t0
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(str(model_dir)).vocab_size)
    batch = to_batch(synthetic_episodes(args.episodes, vocab))
    mask, rank0 = batch.response_mask.bool(), backend.rank == 0
    checks: dict[str, bool] = {}
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "world_size": dist.get_world_size(),
        "model": str(model_dir),
        "param_dtype": args.param_dtype,
        "engine_build_s": round(build_s, 2),
        "checks": checks,
    }
    before = backend.logprobs(batch)
    if rank0:
        summary["reference_max_abs_diff"] = max_diff(
            before, reference_logprobs(model_dir, batch), mask
        )
        checks["engine_matches_reference"] = summary["reference_max_abs_diff"] < tol
    summary["steps"] = _train(backend, batch, args.steps)
    after = backend.logprobs(batch)
    checks["finite_losses"] = all(np.isfinite(s["pg_loss"] or 0.0) for s in summary["steps"])
    checks["weights_changed"] = max_diff(after, before, mask) > 1e-4
    export_diff = _export_diff(backend, batch, after)
    if export_diff is not None:
        summary["export_max_abs_diff"] = export_diff
        checks["export_matches_engine"] = export_diff < tol
    return _finish(summary, args.out, rank0)


if __name__ == "__main__":
    sys.exit(main())
