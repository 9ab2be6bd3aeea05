"""The trainer's lineage: which episodes each update consumed, with that update's metrics.

The trainer (``trainer/loop.py``) appends one line per update to ``consumed.jsonl``::

    {"step": 3, "episodes": ["<episode id>", ...]}

and keeps one row per update in ``metrics.csv`` (``step`` and numeric metrics such as
``reward/mean``, ``policy/version``). A resumed run redoes the updates after its last checkpoint
and appends them again: as in the trainer's metrics log, a step written again replaces its
earlier lines and those of every later step.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.errors import ConfigError

STEPS_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("metrics", pa.map_(pa.string(), pa.float64())),
    ]
)


def consumed(path: Path) -> dict[int, list[str]]:
    """The episode ids of each step in ``consumed.jsonl`` (later writes of a step win)."""
    steps: dict[int, list[str]] = {}
    if not path.exists():
        return steps
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry: Any = json.loads(line)
                step, episodes = int(entry["step"]), [str(e) for e in entry["episodes"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{path}:{number}: not a line {{'step': N, 'episodes': [ids]}} ({exc}); "
                    "fix or remove that line"
                ) from exc
            steps = {s: ids for s, ids in steps.items() if s < step}
            steps[step] = episodes
    return steps


def metrics(path: Path) -> dict[int, dict[str, float]]:
    """The numeric metrics of each step in ``metrics.csv`` (empty cells left out)."""
    rows: dict[int, dict[str, float]] = {}
    if not path.exists():
        return rows
    with open(path, newline="") as f:
        for number, raw in enumerate(csv.DictReader(f), 2):
            try:
                row = {k: float(v) for k, v in raw.items() if k and v not in (None, "")}
                step = int(row.pop("step"))
            except (ValueError, KeyError) as exc:
                raise ConfigError(
                    f"{path}:{number}: a metrics row needs a step and numbers ({exc})"
                ) from exc
            rows[step] = row
    return rows


def steps_table(trainer_dir: Path | None) -> pa.Table:
    """One row per (step, episode id) the trainer consumed, with the step's metrics (null where
    metrics.csv has no row for it). Empty, with the same columns, without a trainer directory."""
    if trainer_dir is None:
        return STEPS_SCHEMA.empty_table()
    by_step = metrics(trainer_dir / "metrics.csv")
    rows = [
        {
            "step": step,
            "episode_id": episode_id,
            "metrics": list(by_step[step].items()) if step in by_step else None,
        }
        for step, episodes in sorted(consumed(trainer_dir / "consumed.jsonl").items())
        for episode_id in episodes
    ]
    return pa.Table.from_pylist(rows, schema=STEPS_SCHEMA)
