"""The streaming loop on two ranks (torchrun, CPU, gloo) with the veRL backend: rank 0 reads the
stream and hands out batches, both ranks update, checkpoint and export together."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from infra.eventlog import EPISODES_TOPIC, open_writer
from schemas.codec import encode_message
from tests.trainer.test_loop import _consumed, _episodes


def test_two_ranks_train_from_one_stream(tiny_model_dir: Path, tmp_path: Path) -> None:
    url = f"local:{tmp_path / 'log'}"
    episodes = _episodes(12, tasks=3)
    with open_writer(url) as writer:
        for e in episodes:
            writer.append(EPISODES_TOPIC, e.rollout_id.encode(), encode_message([e]))
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "openforge", "trainer", "run", "--backend", "verl", "--lora-rank", "0",
        "--episodes", url, "--model", str(tiny_model_dir), "--out", str(out),
        "--group-size", "4", "--token-budget", "80", "--steps", "3", "--lr", "1e-3",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])

    consumed = _consumed(out)
    assert sorted(consumed) == sorted(e.episode_id for e in episodes)  # each once, by the lead
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert all(float(r["actor/grad_norm"]) > 0 for r in rows)
    latest = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text()
    shards = sorted(p.name for p in (latest / "verl").glob("model_world_size_2_rank_*.pt"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
