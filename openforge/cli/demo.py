"""``openforge demo``: the main job, a real RL training run on one CPU.

Builds the tiny model, serves it with vLLM (LoRA adapter ``policy``), runs the capture proxy, a
rollout driver, the Beam pipeline and the trainer, and prints the reward per training step.
"""

from __future__ import annotations

import csv
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table


def demo(
    steps: Annotated[int, typer.Option(help="Training steps (policy updates).")] = 12,
    group_size: Annotated[int, typer.Option(help="Rollouts per task (GRPO group).")] = 4,
    lr: Annotated[float, typer.Option(help="Learning rate of the LoRA adapter.")] = 1e-2,
    seed: Annotated[int, typer.Option(help="Seed of the tiny model and the trainer.")] = 0,
    out: Annotated[Path, typer.Option(help="Where the run's logs, events and plots go.")] = Path(
        "runs/demo"
    ),
) -> None:
    """Train the tiny model with RL on CPU: vLLM, proxy, Beam pipeline, veRL losses, weight sync."""
    from infra.paths import default_tiny_dir
    from infra.tiny_model import build_tiny_model
    from openforge.demo_run import DemoConfig, run_demo

    console = Console()
    # SIGTERM unwinds like Ctrl-C, so vLLM, the proxy and the pipeline are stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with console.status("building the tiny model"):
        model = build_tiny_model(default_tiny_dir(seed), seed=seed)
    console.print(f"model: {model}")
    summary = run_demo(
        out,
        DemoConfig(steps=steps, group_size=group_size, lr=lr, seed=seed),
        model,
        say=console.print,
    )
    rows = list(csv.DictReader((out / "trainer" / "metrics.csv").read_text().splitlines()))
    table = Table("step", "episodes", "mean reward", "IS weight mean", "staleness max", "swap s")
    for r in rows:
        table.add_row(
            r["step"],
            r["data/episodes"],
            f"{float(r['reward/mean']):.3f}",
            f"{float(r.get('rollout_corr/rollout_is_mean') or 0):.3f}",
            r["staleness/max"],
            f"{float(r.get('sync/seconds') or 0):.3f}",
        )
    console.print(table)
    rewards = [float(r["reward/mean"]) for r in rows]
    k = max(1, len(rewards) // 3)
    console.print(
        f"{summary['steps']} updates from {summary['rollouts']} rollouts in "
        f"{float(summary['seconds']):.0f} s (policy version {summary['policy_version']}); mean "
        f"reward {sum(rewards[:k]) / k:.3f} over the first {k} steps -> "
        f"{sum(rewards[-k:]) / k:.3f} over the last {k}"
    )
    console.print(
        f"metrics: {out}/trainer/metrics.csv; reward curve: "
        f"{out}/trainer/reward_curve.png; events: {out}/log"
    )
