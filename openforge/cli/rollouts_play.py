"""Playing one harness's rollouts for ``openforge rollouts run``: each task checked (its image
built), the rollouts of those that can run with live progress, then the summary table and
whether the run succeeded (a run where nothing was verified, or a rollout gave up, fails)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from infra.harnesses import Harness
    from infra.tasks import Task
    from orchestrator.plan import PlannedRollout
    from orchestrator.run import Orchestrator
    from orchestrator.rundir import RolloutOutcome


def play(console: Console, orch: Orchestrator, planned: list[PlannedRollout], label: str) -> bool:
    """Check each task, run the rollouts of those that can run, and print what happened;
    False when a task was refused, a rollout gave up, or none was verified."""
    from orchestrator.progress import live_progress, summary_table

    tasks = list({p.task.id: p.task for p in planned}.values())
    refused = _check_each(console, orch, tasks)  # images are built here, task by task
    runnable = [p for p in planned if p.task.id not in refused]
    if not runnable:
        console.print(f"[red]{label}no task can run[/]: {len(refused)} refused (above)")
        return False
    start = time.monotonic()
    try:
        with live_progress(console, orch.counts):
            outcomes = orch.run(runnable)
    except KeyboardInterrupt:
        console.print("[yellow]cancelled[/]: running sandboxes stopped")
        raise typer.Exit(130) from None
    console.print(summary_table(outcomes))
    counts, mean = orch.counts, orch.counts.mean_reward
    console.print(
        f"{label}{counts.done} verified, {counts.gave_up} gave up after infrastructure failures, "
        f"{counts.calls} calls recorded, mean reward {'-' if mean is None else f'{mean:.3f}'}, "
        f"{time.monotonic() - start:.1f} s; summary: {orch.run_dir.root / 'summary.csv'}"
    )
    _no_calls_note(console, orch.harness, outcomes)
    if refused:
        console.print(f"[red]{len(refused)} tasks refused[/]: {', '.join(sorted(refused))}")
    return _verified(console, orch.run_dir.root, outcomes) and not refused


def _check_each(console: Console, orch: Orchestrator, tasks: Sequence[Task]) -> dict[str, str]:
    """Check (and build the image of) each task before anything runs; a task that cannot run
    here is refused with its reason and the others go on. Returns the refused ids."""
    from schemas.errors import TaskError

    refused: dict[str, str] = {}
    for task in tasks:
        try:
            for note in orch.check([task]):
                console.print(f"[dim]note:[/] {note}")
        except TaskError as exc:
            refused[task.id] = str(exc)
            console.print(f"[red]refused[/] {task.id}: {exc}")
    return refused


def _no_calls_note(console: Console, chosen: Harness, outcomes: Sequence[RolloutOutcome]) -> None:
    """Say so when a harness that calls a model ended rollouts before its first call."""
    from orchestrator.rundir import Status

    silent = [o for o in outcomes if o.status is Status.VERIFIED and not o.calls]
    if chosen.capabilities.calls_model and silent:
        console.print(
            f"[yellow]note:[/] {len(silent)} rollouts made no call to the model "
            f"(e.g. {silent[0].rollout_id}: the harness ended before asking it; see its agent.err)"
        )


def _verified(console: Console, out: Path, outcomes: Sequence[RolloutOutcome]) -> bool:
    """False when a rollout gave up after infrastructure failures, or none was verified:
    then the first failure's message and where its files are are printed."""
    from orchestrator.rundir import Status

    failed = [o for o in outcomes if o.status is Status.INFRA_FAILED]
    if not failed and any(o.status is Status.VERIFIED for o in outcomes):
        return True
    if failed:
        first = failed[0]
        console.print(
            f"[bold red]first failure[/] ({first.rollout_id}, attempt {first.attempt}): "
            f"{first.message.strip()[:1500]}\n  its files: {out / 'rollouts' / first.rollout_id}"
        )
    else:
        console.print("[bold red]no rollout was verified[/]")
    return False
