"""``openforge replay train``: a ``--where`` selection over the ``episodes`` view is exactly what
the trainer's loop (RL) or SFT consumes; a re-scored episode is trained with its new reward.

The archive holds episodes as the pipeline writes them (``ArchiveWriter``), with real token ids
of the tiny model's vocabulary and behavior logprobs."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from openforge.cli import app
from schemas.archive import ArchiveWriter, read_archive
from schemas.completion import PolicySpan
from schemas.episode import Episode, Sample

T0 = 1_796_000_000_000_000


def _archive(root: Path) -> list[Episode]:
    """Three tasks x two episodes (one group each, policy versions 0-2), and a dead letter;
    the first episode is also there again, rebuilt later with another reward."""
    rng = np.random.default_rng(3)
    episodes = []
    for i in range(6):
        tokens = rng.integers(10, 400, size=16).tolist()
        mask = [0] * 6 + [1] * 4 + [0] * 2 + [1] * 4  # two calls, a tool result between
        lps = [-5.0 if m else 0.0 for m in mask]
        spans = [PolicySpan(i % 3, 6, 10), PolicySpan(i % 3, 12, 16)]
        episodes.append(
            Episode(
                f"ep{i}",
                f"r{i}",
                [Sample(0, tokens, mask, lps, spans)],
                float(i % 2),
                T0 + i,
                task_id=f"task{i // 2}",
                group_id=f"g{i // 2}",
                harness="agent",
            )
        )
    dead = Episode("dead", "rd", [], None, T0, task_id="task0", dead_letter="no reward")
    rebuilt = replace(episodes[0], reward=1.0, created_us=T0 + 100)
    ArchiveWriter(root).write([*episodes, dead])
    ArchiveWriter(root).write([rebuilt])
    return episodes


def _consumed(out: Path) -> list[str]:
    lines = (out / "consumed.jsonl").read_text().splitlines()
    return [e for line in lines for e in json.loads(line)["episodes"]]


def test_rl_trains_on_exactly_the_selected_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    _archive(tmp_path / "archive")
    out = tmp_path / "rl"
    result = CliRunner().invoke(
        app,
        [
            "replay", "train", "--from", str(tmp_path / "archive"), "--model",
            str(tiny_model_dir), "--out", str(out), "--where", "task_id <> 'task1'",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "RL on 4 selected episodes" in result.output
    assert sorted(_consumed(out)) == ["ep0", "ep1", "ep4", "ep5"]  # each once, nothing else
    selected = {e.episode_id: e for e in read_archive(out / "selected", Episode)}
    assert selected["ep0"].reward == 1.0  # the rebuilt record, as the view shows it
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 1 and "rollout_corr/rollout_is_mean" in rows[0]  # off-policy corrected
    assert (out / "checkpoints" / "LATEST").exists()


def test_sft_trains_on_the_generated_tokens_of_the_selection(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _archive(tmp_path / "archive")
    out = tmp_path / "sft"
    result = CliRunner().invoke(
        app,
        [
            "replay", "train", "--from", str(tmp_path / "archive"), "--model",
            str(tiny_model_dir), "--out", str(out), "--where", "reward > 0", "--sft",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(set(_consumed(out))) == ["ep0", "ep1", "ep3", "ep5"]
    assert (out / "model" / "config.json").exists()
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 1 and float(rows[0]["sft/loss"]) > 0  # 8 examples: one batch of 8


def test_a_predicate_that_selects_nothing_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    _archive(tmp_path / "archive")
    result = CliRunner().invoke(
        app,
        [
            "replay", "train", "--from", str(tmp_path / "archive"), "--model",
            str(tiny_model_dir), "--out", str(tmp_path / "x"), "--where", "task_id = 'nope'",
        ],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "no trainable episode" in str(result.exception)
