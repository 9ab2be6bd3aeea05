"""The main job end to end: vLLM, proxy, rollouts, Beam pipeline, trainer, weight sync."""

from __future__ import annotations

import csv
from pathlib import Path

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, open_reader
from openforge.demo_run import DemoConfig, lowercase_reward, run_demo
from schemas.codec import decode_message


def test_reward_is_the_lowercase_fraction() -> None:
    assert lowercase_reward("") == 0.0
    assert lowercase_reward("abC d") == 0.6


def test_training_demo_runs_every_part_for_real(tiny_model_dir: Path, tmp_path: Path) -> None:
    summary = run_demo(tmp_path, DemoConfig(steps=3), tiny_model_dir, say=lambda _: None)
    assert summary["steps"] == 3 and summary["policy_version"] == 3
    rows = list(csv.DictReader((tmp_path / "trainer" / "metrics.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert all(float(r["sync/seconds"]) > 0 for r in rows)  # each update was hot-loaded
    assert all(0.0 <= float(r["reward/mean"]) <= 1.0 for r in rows)
    assert (tmp_path / "trainer" / "reward_curve.png").exists()

    def topic(name: str) -> list[object]:
        with open_reader(f"local:{tmp_path / 'log'}", [name], "check") as reader:
            return [e for rec in reader.poll(5000, 1.0) for e in decode_message(rec.value)]

    episodes = topic(EPISODES_TOPIC)
    assert len(episodes) >= 12  # three groups of four, at least
    assert topic(DEAD_LETTER_TOPIC) == []
