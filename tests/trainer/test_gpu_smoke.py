"""The GPU smoke script, run here on CPU ranks under torchrun: one rank, then two (data parallel
through veRL's engine and gloo). Both must pass their checks and make the same updates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def smoke(nproc: int, out: Path, tiny_model_dir: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "trainer.gpu_smoke",
        "--model",
        str(tiny_model_dir),
        "--episodes",
        "8",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    return dict(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return smoke(1, tmp_path_factory.mktemp("smoke") / "one.json", tiny_model_dir)


def test_smoke_passes_on_one_rank(one_rank: dict[str, Any]) -> None:
    assert one_rank["ok"] and all(one_rank["checks"].values())
    assert one_rank["world_size"] == 1 and len(one_rank["steps"]) == 2
    assert one_rank["reference_max_abs_diff"] < 2e-3 and one_rank["export_max_abs_diff"] < 2e-3


def test_two_ranks_make_the_same_updates(
    one_rank: dict[str, Any], tiny_model_dir: Path, tmp_path: Path
) -> None:
    two = smoke(2, tmp_path / "two.json", tiny_model_dir)
    assert two["ok"] and two["world_size"] == 2
    for a, b in zip(one_rank["steps"], two["steps"], strict=True):
        assert b["pg_loss"] == pytest.approx(a["pg_loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
