"""Weight-swap time: LoRA hot-load vs full-weight reload, side by side on one vLLM server.

    .venv/bin/python -m bench.weight_sync --swaps 5

Trains the tiny model one step with each CPU-backend variant (LoRA rank 8; full weights), then
swaps each export into the same vLLM server ``--swaps`` times (gate, load, version, ungate, with
a proxy-less WeightSync) and prints the seconds per swap (median, max) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from openforge.testing.episodes import fixed_episodes
from trainer.algorithms import AlgorithmConfig
from trainer.backends.cpu import CPUBackend
from trainer.batch import to_batch
from trainer.weight_sync import SyncMode, WeightSync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--swaps", type=int, default=5)
    args = parser.parse_args()
    model = build_tiny_model(default_tiny_dir(0), seed=0)
    batch = to_batch(fixed_episodes())
    with tempfile.TemporaryDirectory() as tmp, VLLMServer(model, served_model_name="tiny") as v:
        exports = {}
        for name, rank in (("lora", 8), ("full", None)):
            backend = CPUBackend(model, lora_rank=rank, lr=1e-2)
            backend.train_step(batch, AlgorithmConfig())
            exports[name] = backend.export_for_inference(Path(tmp) / name)
        times: dict[str, list[float]] = {"lora": [], "full": []}
        for i in range(args.swaps):  # interleaved, so drift hits both alike
            for mode in ("lora", "full"):
                sync = WeightSync(v.base_url, lora_name="policy", mode=SyncMode(mode))
                times[mode].append(sync.swap(exports[mode], policy_version=i + 1))
        WeightSync(v.base_url, mode=SyncMode.FULL).load_full(model)
    for mode, values in times.items():
        print(f"{mode}: median {statistics.median(values):.3f} s, max {max(values):.3f} s")
    ratio = statistics.median(times["full"]) / statistics.median(times["lora"])
    print(f"full / lora (median): {ratio:.2f}")


if __name__ == "__main__":
    main()
