"""The live progress line of a rollout job, and its summary table (rich)."""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.rundir import RolloutOutcome, Status


@dataclass
class Counts:
    """Live counters, read by the progress display (updated under the orchestrator's lock)."""

    planned: int = 0
    queued: int = 0
    running: int = 0
    done: int = 0
    agent_failures: int = 0  # the agent failed or timed out (scored as the verifier says)
    infra_failures: int = 0  # attempts that failed for infrastructure reasons (retried)
    gave_up: int = 0  # rollouts whose every attempt failed for infrastructure reasons
    cancelled: int = 0
    calls: int = 0  # model calls the proxy recorded for the verified rollouts
    rewards: list[float] = field(default_factory=list)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


def status_line(counts: Counts, elapsed_s: float) -> Text:
    mean = counts.mean_reward
    text = (
        f"rollouts {counts.planned}: queued {counts.queued} | running {counts.running} | "
        f"done {counts.done} | agent failures {counts.agent_failures} | infra failures "
        f"{counts.infra_failures} (gave up {counts.gave_up}) | mean reward "
        f"{'-' if mean is None else f'{mean:.3f}'} | {elapsed_s:.0f}s"
    )
    return Text(text)


@contextmanager
def live_progress(console: Console, counts: Counts) -> Iterator[None]:
    """Refresh a status line from ``counts`` until the block ends (quiet when not a tty)."""
    start = time.monotonic()
    stop = threading.Event()
    with Live(status_line(counts, 0), console=console, transient=False) as live:

        def refresh() -> None:
            while not stop.wait(0.5):
                live.update(status_line(counts, time.monotonic() - start))

        thread = threading.Thread(target=refresh, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            live.update(status_line(counts, time.monotonic() - start))


def summary_table(outcomes: Sequence[RolloutOutcome]) -> Table:
    """Per task: rollouts, verified, mean reward, model calls recorded, the median seconds from
    an attempt's start to its first model call (agent ready), agent ends and infrastructure
    failures."""
    table = Table(
        "task",
        "rollouts",
        "verified",
        "mean reward",
        "calls",
        "ready p50 (s)",
        "agent ends",
        "infra failed",
    )
    by_task: dict[str, list[RolloutOutcome]] = defaultdict(list)
    for r in outcomes:
        by_task[r.task_id].append(r)
    for task, rows in sorted(by_task.items()):
        rewards = [r.reward for r in rows if r.reward is not None]
        ends: dict[str, int] = defaultdict(int)
        for r in rows:
            if r.agent_phase:
                ends[r.agent_phase] += 1
        table.add_row(
            task,
            str(len(rows)),
            str(sum(r.status is Status.VERIFIED for r in rows)),
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
            str(sum(r.calls or 0 for r in rows)),
            _median([r.ready_s for r in rows if r.ready_s is not None]),
            ", ".join(f"{k} {v}" for k, v in sorted(ends.items())) or "-",
            str(sum(r.status is Status.INFRA_FAILED for r in rows)),
        )
    return table


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"
