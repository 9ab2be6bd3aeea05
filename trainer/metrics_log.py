"""Per-step metrics: a CSV file, TensorBoard scalars, and a reward-curve PNG."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an earlier run's metrics.csv (a resumed run appends to them)."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for key, value in raw.items():
                if value not in (None, ""):
                    number = float(value)
                    row[key] = int(number) if key == "step" else number
            rows.append(row)
    return rows


class MetricsLog:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.rows: list[dict[str, Any]] = _read_rows(directory / "metrics.csv")
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(directory / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: v for k, v in metrics.items() if isinstance(v, int | float)}}
        # A step logged again (a resumed run redoing the update after the last checkpoint)
        # replaces its earlier row.
        self.rows = [r for r in self.rows if r["step"] < step]
        self.rows.append(row)
        for key, value in row.items():
            if key != "step":
                self._tb.add_scalar(key, value, step)
        self._tb.flush()
        self._write_csv()

    def _write_csv(self) -> None:
        keys = sorted({k for row in self.rows for k in row}, key=lambda k: (k != "step", k))
        with open(self.directory / "metrics.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)

    def plot_rewards(self) -> Path | None:
        points = [(r["step"], r["reward/mean"]) for r in self.rows if "reward/mean" in r]
        if not points:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward")
        ax.set_title("reward per training step")
        ax.grid(alpha=0.3)
        path = self.directory / "reward_curve.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        self._tb.close()
