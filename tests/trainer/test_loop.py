"""The training loop on a local log: it learns, logs, checkpoints, and resumes without training
on any episode twice or skipping one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from infra.eventlog import EPISODES_TOPIC, open_writer
from schemas.codec import encode_message
from schemas.completion import PolicySpan
from schemas.episode import Episode, Sample
from trainer.loop import TrainerConfig, train
from trainer.stream import StreamConfig


def _episodes(n: int, tasks: int) -> list[Episode]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        tokens = rng.integers(10, 400, size=20).tolist()
        mask = [0] * 10 + [1] * 10
        lps = [-6.0 if m else 0.0 for m in mask]
        out.append(
            Episode(
                f"ep{i:03d}",
                f"r{i}",
                [Sample(0, tokens, mask, lps, [PolicySpan(0, 10, 20)])],
                float(rng.random() > 0.5),
                0,
                task_id=f"task{i % tasks}",
            )
        )
    return out


def _consumed(out: Path) -> list[str]:
    return [
        e
        for line in (out / "consumed.jsonl").read_text().splitlines()
        for e in json.loads(line)["episodes"]
    ]


def test_train_checkpoint_resume_consumes_each_episode_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    url = f"local:{tmp_path / 'log'}"
    episodes = _episodes(24, tasks=3)
    dead = Episode("dead1", "rd", [], None, 0, dead_letter="no reward by the deadline")
    with open_writer(url) as writer:
        for e in [*episodes[:12], dead, episodes[0], *episodes[12:]]:  # a dead letter, a duplicate
            writer.append(EPISODES_TOPIC, e.rollout_id.encode(), encode_message([e]))
    out = tmp_path / "run"
    stream = StreamConfig(group_size=4, token_budget=80)  # one group of 4 x 20 tokens per batch
    first = train(TrainerConfig(url, tiny_model_dir, out, steps=2, stream=stream, lr=1e-2))
    assert first["steps"] == 2
    assert len(_consumed(out)) == 8

    # Lose the committed stream position (a crash after the checkpoint): every episode is
    # delivered again, and the checkpoint's ids keep the first eight from being trained twice.
    for group_file in (tmp_path / "log").rglob("groups/*.json"):
        group_file.unlink()
    second = train(TrainerConfig(url, tiny_model_dir, out, stream=stream, idle_timeout=2.0))
    assert second["steps"] == 6
    consumed = _consumed(out)
    assert sorted(consumed) == sorted(e.episode_id for e in episodes)  # each once, none skipped
    assert first["stats"].dead_letters == 1  # counted, never trained on

    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]  # the resumed run appends
    for key in ("actor/pg_loss", "rollout_corr/rollout_is_mean", "reward/mean", "staleness/max"):
        assert key in rows[0], sorted(rows[0])
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())
    assert (out / "checkpoints" / "LATEST").read_text() == "step-00000006"


def test_a_round_with_nothing_to_train_is_a_skipped_update_not_a_stall(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Paced by rounds, update 1's group had no trainable episode (both members lost): the
    update is skipped (the weights stay, the step is counted and recorded), and update 2 trains
    on the next round as usual."""
    url = f"local:{tmp_path / 'log'}"
    good = _episodes(4, tasks=1)
    lost = [
        Episode(f"lost{i}", f"rl{i}", [], None, 0, task_id="x", dead_letter="no call")
        for i in range(2)
    ]
    with open_writer(url) as writer:
        for e in [*lost, *good[:2]]:
            writer.append(EPISODES_TOPIC, e.rollout_id.encode(), encode_message([e]))
    out = tmp_path / "run"
    stream = StreamConfig(group_size=2, groups_per_batch=1, group_timeout_s=3600)
    summary = train(TrainerConfig(url, tiny_model_dir, out, steps=2, stream=stream, lr=1e-2))
    assert summary["steps"] == 2
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert rows[0]["update/skipped"] == "1.0" and rows[0]["data/episodes"] == "0"
    assert rows[1]["data/episodes"] == "2" and "actor/pg_loss" in rows[1]
    assert sorted(_consumed(out)) == ["ep000", "ep001"]
