"""``openforge replay``: work again on a recorded run: rebuild its episodes, re-score it,
retrain on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from schemas.registry import one_of
from trainer.algorithm_names import AdvantageEstimator
from trainer.backends import BackendName

app = typer.Typer(
    help="Rebuild a recorded run's episodes, re-score it with a changed verifier, retrain "
    "offline on chosen episodes.",
    no_args_is_help=True,
)


@app.command("rebuild")
def rebuild(
    from_: Annotated[
        Path,
        typer.Option(
            "--from", help="The run's archive (RUN/archive), or the run dir.", resolve_path=True
        ),
    ],
    to: Annotated[
        Path, typer.Option(help="New or empty dir for the rebuilt episodes.", resolve_path=True)
    ],
    lateness: Annotated[
        float | None,
        typer.Option(help="Seconds a rollout waits for its reward (default: the run's)."),
    ] = None,
    check: Annotated[
        bool, typer.Option(help="Compare the rebuilt episodes with the archived ones.")
    ] = True,
    beam_arg: Annotated[
        list[str] | None,
        typer.Option(help="A Beam pipeline option (repeatable); default runner FnApiRunner."),
    ] = None,
) -> None:
    """Rebuild every episode from the archived events with the current assembly code (batch
    Beam) and check that they equal the archived episodes record for record; exit 1 if not."""
    from openforge.replay.rebuild import rebuild as run

    report = run(from_, to, beam_arg or [], lateness, check)
    for line in report.lines():
        typer.echo(line)
    if report.diff is not None and not report.diff.identical:
        raise typer.Exit(1)


@app.command("rescore")
def rescore(
    run: Annotated[Path, typer.Option("--from", help="The run directory.", resolve_path=True)],
    tasks: Annotated[
        Path, typer.Option(help="The task set with the (changed) verifiers.", resolve_path=True)
    ],
    verifier_version: Annotated[
        int | None,
        typer.Option(help="Version of the new rewards (default: one above the highest recorded)."),
    ] = None,
    to: Annotated[
        Path | None,
        typer.Option(
            help="Episode archive for the rebuilt episodes (default: the run's).", resolve_path=True
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Verifier sandboxes at once.")] = 2,
    beam_arg: Annotated[
        list[str] | None, typer.Option(help="A Beam option for the rebuild (repeatable).")
    ] = None,
) -> None:
    """Run each task's verifier over the run's saved final workspaces in the sandbox, publish
    the new rewards (marked with the verifier version), rebuild the episodes they change."""
    from rich.console import Console
    from rich.table import Table

    from infra.sandbox import sandbox
    from openforge.cli.userns import enter_for_containers
    from openforge.replay.rescore import RescoreConfig
    from openforge.replay.rescore import rescore as run_rescore
    from orchestrator.environments import Environments

    enter_for_containers()
    console = Console(soft_wrap=True)  # a path is never broken across lines
    cfg = RescoreConfig(run, tasks, verifier_version, to, concurrency, tuple(beam_arg or ()))
    report = run_rescore(cfg, Environments(sandbox()))
    table = Table(title=f"re-score with verifier version {report.version}")
    for column in ("task", "rollouts re-scored", "rewards changed", "episodes rebuilt"):
        table.add_column(column, justify="left" if column == "task" else "right")
    rows = report.by_task()
    for task, n, changed, rebuilt in rows:
        table.add_row(task, str(n), str(changed), str(rebuilt))
    totals = [sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows)]
    table.add_row("total", *map(str, totals), style="bold")
    console.print(table)
    for r in report.rescored:
        if r.error is not None:
            console.print(f"[yellow]not re-scored[/] {r.rollout_id}: {r.error}")
        elif r.changed:
            console.print(f"changed {r.rollout_id}: {r.old_reward} -> {r.new_reward}")
    if report.skipped:
        console.print(f"{len(report.skipped)} rollouts skipped (reasons in the report)")
    if report.pipeline is not None:
        console.print(report.pipeline.line())
    console.print(f"report: {report.directory / 'report.json'}")
    console.print(
        f"{totals[0]} rollouts re-scored, {totals[1]} rewards changed, "
        f"{totals[2]} episodes rebuilt, {len(report.skipped)} skipped"
    )
    if totals[0] == 0:
        first = next(iter(report.skipped.items()), None)
        why = f"; the first skipped, {first[0]}: {first[1]}" if first else ": it has no rollouts"
        console.print(f"[red]error:[/] nothing in {run} was re-scored{why}")
        raise typer.Exit(1)


@app.command("train")
def train(
    source: Annotated[
        Path, typer.Option("--from", help="An archive root or a run directory.", resolve_path=True)
    ],
    model: Annotated[
        Path, typer.Option(help="The model to start from (Hugging Face format).", resolve_path=True)
    ],
    out: Annotated[
        Path, typer.Option(help="Checkpoints, metrics, the selection go here.", resolve_path=True)
    ],
    where: Annotated[
        str | None,
        typer.Option(help="SQL predicate over the `episodes` view of `openforge query`."),
    ] = None,
    sft: Annotated[
        bool, typer.Option("--sft", help="Supervised fine-tuning on the generated tokens.")
    ] = False,
    backend: Annotated[
        BackendName,
        typer.Option(help=f"RL trainer backend: {one_of(BackendName)} (cpu: the reference)."),
    ] = BackendName.CPU,
    lora_rank: Annotated[int, typer.Option(help="RL: LoRA rank; 0 trains full weights.")] = 8,
    lr: Annotated[float, typer.Option(help="Learning rate.")] = 1e-3,
    advantage: Annotated[
        AdvantageEstimator, typer.Option(help="RL: veRL advantage estimator.")
    ] = AdvantageEstimator.GRPO,
    rollout_is: Annotated[
        str, typer.Option(help="RL: IS correction: token, sequence or none.")
    ] = "token",
    sft_epochs: Annotated[int, typer.Option(help="SFT: passes over the examples.")] = 1,
) -> None:
    """Retrain offline on the episodes WHERE selects: off-policy RL with the recorded behavior
    logprobs (the trainer's loop), or SFT with --sft."""
    from openforge.replay.train import ReplayTrainConfig, replay_train
    from trainer.algorithms import AlgorithmConfig

    summary = replay_train(
        ReplayTrainConfig(
            source=source,
            model_dir=model,
            out=out,
            where=where,
            sft=sft,
            backend=backend,
            lora_rank=lora_rank or None,
            lr=lr,
            algo=AlgorithmConfig(
                advantage=advantage, rollout_is=None if rollout_is == "none" else rollout_is
            ),
            sft_epochs=sft_epochs,
        )
    )
    what = "SFT" if sft else "RL"
    stats = summary.get("stats")
    if stats is not None and stats.timed_out_alone:
        typer.echo(
            f"{stats.timed_out_alone} selected episodes were alone in their group (no advantage):"
            " not trained on"
        )
    typer.echo(
        f"{what} on {summary['selected']} selected episodes: {summary['steps']} steps; "
        f"consumed episodes in {out}/consumed.jsonl, metrics in {out}/metrics.csv"
    )
