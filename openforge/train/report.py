"""What a training run shows: the live progress line, the summary table, the curves PNG, and
the report it ends with (``curves.png`` and ``summary.json`` in the run directory)."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rich.console import Console, Group
from rich.live import Live as RichLive
from rich.table import Table
from rich.text import Text

from infra.engine_meter import EngineTotals
from openforge.train.config import TrainConfig
from openforge.train.driver import EvalLog, Evaluation, RolloutDriver
from orchestrator.run import Orchestrator

FAULTED_EVAL = "eval-faulted.csv"  # the held-out split with sandbox faults (faults.heldout)


@dataclass
class Live:
    """What the progress display shows, updated by the trainer's callback."""

    step: int = 0
    policy_version: int = 0
    train_reward: float | None = None
    step_times: list[float] | None = None
    started: float = 0.0
    last_step_at: float = 0.0


class RunView(Protocol):
    """What the progress display reads of a running training run (``run.TrainingRun``)."""

    cfg: TrainConfig
    live: Live
    evals: EvalLog
    train_orch: Orchestrator | None
    eval_orch: Orchestrator | None
    driver: RolloutDriver | None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def progress_text(run: RunView) -> Group:
    """One screen: rollouts, episodes, update, policy version, rewards, time per step, ETA."""
    live, cfg = run.live, run.cfg
    counts = [o.counts for o in (run.train_orch, run.eval_orch) if o is not None]
    queued = sum(c.queued for c in counts)
    running = sum(c.running for c in counts)
    done = sum(c.done for c in counts)
    failed = sum(c.gave_up for c in counts)
    times = live.step_times or []
    per_step = sum(times[-5:]) / len(times[-5:]) if times else None
    left = cfg.trainer.steps - live.step
    eta = None if per_step is None else per_step * left
    heldout = run.evals.last
    state = (
        "evaluating held-out" if run.driver is not None and run.driver.evaluating else "training"
    )
    line = Text.assemble(
        ("rollouts ", "bold"), f"{queued} queued, {running} running, {done} done",
        f" ({failed} gave up)  " if failed else "  ",
        ("update ", "bold"), f"{live.step}/{cfg.trainer.steps}  ",
        ("policy ", "bold"), f"v{live.policy_version}  ",
        ("train reward ", "bold"), f"{_fmt(live.train_reward)}  ",
        ("held-out ", "bold"),
        "-" if heldout is None else f"{heldout.mean_reward:.3f} (v{heldout.policy_version})",
        "  ",
        ("s/update ", "bold"), f"{_fmt(per_step, 1)}  ",
        ("ETA ", "bold"), "-" if eta is None else f"{eta:.0f} s",
        f"  [{state}]",
    )  # fmt: skip
    return Group(line)


@contextmanager
def live_progress(console: Console, run: RunView) -> Iterator[None]:
    """Refresh the progress line twice a second while the block runs (not on a non-terminal)."""
    if not console.is_terminal:
        yield
        return
    with RichLive(progress_text(run), console=console, refresh_per_second=2, transient=True) as rl:

        def refresh() -> Group:
            return progress_text(run)

        rl.get_renderable = refresh  # type: ignore[method-assign]
        yield


def read_metrics(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)}
            for row in csv.DictReader(f)
        ]


def summary_table(metrics: list[dict[str, float]], evals: list[Evaluation]) -> Table:
    by_version = {e.policy_version: e.mean_reward for e in evals}
    table = Table(title="training run")
    for name in (
        "update",
        "episodes",
        "train reward",
        "held-out",
        "behavior KL",
        "IS weight",
        "staleness",
        "s",
    ):
        table.add_column(name, justify="right")
    if 0 in by_version:
        table.add_row("0", "-", "-", _fmt(by_version[0]), "-", "-", "-", "-")
    for row in metrics:
        step = int(row["step"])
        version = int(row.get("policy/version", step))
        table.add_row(
            str(step),
            str(int(row.get("data/episodes", 0))),
            _fmt(row.get("reward/mean")),
            _fmt(by_version.get(version)),
            _fmt(row.get("actor/behavior_kl"), 4),
            _fmt(row.get("rollout_corr/rollout_is_mean", row.get("rollout_is_mean")), 3),
            str(int(row.get("staleness/max", 0))),
            _fmt(row.get("time/step_s"), 2),
        )
    return table


def plot_curves(
    path: Path,
    metrics: list[dict[str, float]],
    evals: list[Evaluation],
    title: str,
    faulted: Sequence[Evaluation] = (),
) -> Path:
    """Train reward per update and held-out reward per policy version (and with sandbox
    faults, dashed), on one chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [(r["step"], r["reward/mean"]) for r in metrics if "reward/mean" in r]
    if train:
        ax.plot(
            [p[0] for p in train],
            [p[1] for p in train],
            marker=".",
            alpha=0.7,
            label="train (rollouts of the update)",
        )
    if evals:
        ax.plot(
            [e.policy_version for e in evals],
            [e.mean_reward for e in evals],
            marker="o",
            linewidth=2,
            label="held-out tasks",
        )
    if faulted:
        ax.plot(
            [e.policy_version for e in faulted],
            [e.mean_reward for e in faulted],
            marker="s",
            linestyle="--",
            linewidth=2,
            label="held-out tasks, a sandbox fault in each",
        )
    ax.set_xlabel("update (policy version)")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class RunSummary:
    """The figures a run is judged by (``summary.json``).

    Attributes:
        updates: updates made (rows of metrics.csv, over every launch).
        policy_version: the version of the last update's weights.
        heldout_initial, heldout_final: the first and the last held-out mean reward.
        heldout: held-out mean reward per policy version evaluated.
        heldout_faulted: the same with a sandbox fault in every rollout (``faults.heldout``).
        faults: the rate of each fault kind injected into training (``faults.rates``; empty:
            none was).
        train_first, train_last: mean train reward of the first and the last (up to) 3 updates.
        max_behavior_kl: the largest trainer-vs-engine KL of any update.
        seconds: the launch's time from the driver's start to the last episode.
    """

    updates: int
    policy_version: int
    heldout_initial: float | None
    heldout_final: float | None
    heldout: dict[int, float]
    train_first: float | None
    train_last: float | None
    max_behavior_kl: float | None
    seconds: float
    heldout_faulted: dict[int, float] = field(default_factory=dict)
    faults: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """What a finished run leaves for its reader: the summary, the metrics and the curves."""

    summary: RunSummary
    metrics: list[dict[str, float]]
    curves: Path


def run_summary(
    root: Path, seconds: float, faults: Mapping[str, float] | None = None
) -> RunSummary:
    """The figures a run is judged by, from its run directory (``faults``: the rates of the
    faults injected into its training)."""
    metrics = read_metrics(root / "trainer" / "metrics.csv")
    evals, faulted = EvalLog(root / "eval.csv").rows, root / FAULTED_EVAL
    rewards = [r["reward/mean"] for r in metrics if "reward/mean" in r]
    k = max(1, min(3, len(rewards) // 2)) if rewards else 0
    return RunSummary(
        updates=len(metrics),
        policy_version=int(metrics[-1].get("policy/version", 0)) if metrics else 0,
        heldout_initial=evals[0].mean_reward if evals else None,
        heldout_final=evals[-1].mean_reward if evals else None,
        heldout={e.policy_version: e.mean_reward for e in evals},
        train_first=sum(rewards[:k]) / k if k else None,
        train_last=sum(rewards[-k:]) / k if k else None,
        max_behavior_kl=max((abs(r.get("actor/behavior_kl", 0.0)) for r in metrics), default=None),
        seconds=round(seconds, 1),
        heldout_faulted={e.policy_version: e.mean_reward for e in EvalLog(faulted).rows},
        faults={kind: rate for kind, rate in (faults or {}).items() if rate > 0},
    )


def previous_seconds(root: Path) -> float:
    """The seconds the run's last written summary says it took (0 without one)."""
    try:
        return float(json.loads((root / "summary.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def write_summary(root: Path, summary: RunSummary) -> None:
    """``summary.json`` in the run directory."""
    text = json.dumps(dataclasses.asdict(summary), indent=2, default=str)
    (root / "summary.json").write_text(text + "\n")


def write_report(
    root: Path,
    evals: list[Evaluation],
    title: str,
    seconds: float,
    faults: Mapping[str, float] | None = None,
) -> Report:
    """The run's report: ``curves.png`` and ``summary.json`` written to ``root``."""
    metrics = read_metrics(root / "trainer" / "metrics.csv")
    faulted = EvalLog(root / FAULTED_EVAL).rows
    curves = plot_curves(root / "curves.png", metrics, evals, title, faulted)
    summary = run_summary(root, seconds, faults)
    write_summary(root, summary)
    return Report(summary, metrics, curves)


def write_engine_totals(root: Path, totals: EngineTotals) -> None:
    """``engine.json``: where the engine's time went per call in this launch (vLLM's own
    counters: prefill and decode milliseconds, tokens, the prefix cache's hit rate)."""
    (root / "engine.json").write_text(json.dumps(totals.per_call(), indent=2) + "\n")


def dataset_name(dataset: str) -> str:
    """The task set's name for titles (``echo-words``), not the machine's path to it: a
    directory's name, or a manifest's directory's."""
    path = Path(dataset)
    return path.parent.name if path.suffix == ".toml" else path.name
