"""``openforge rollout``: run one harness on a prompt through a running proxy, unsandboxed (for
debugging a harness; ``openforge rollouts run`` runs tasks in sandboxes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from infra.harnesses import HARNESSES

app = typer.Typer(
    help="Run one harness through a proxy, unsandboxed (debugging).", no_args_is_help=True
)


@app.command("run")
def run(
    harness_name: Annotated[
        str,
        typer.Argument(metavar="HARNESS", help=f"The harness: {HARNESSES.listing()}."),
    ],
    task: Annotated[str, typer.Argument(help="The task prompt.")],
    proxy: Annotated[str, typer.Option(help="The proxy's base URL.")] = "http://127.0.0.1:8100",
    root: Annotated[
        Path,
        typer.Option("--dir", help="Where rollout homes and workspaces go.", resolve_path=True),
    ] = Path("rollouts"),
    model: Annotated[str, typer.Option(help="Model name the harness asks for.")] = "tiny",
    rollout_id: Annotated[str | None, typer.Option(help="Rollout id (default: new).")] = None,
    task_id: Annotated[str | None, typer.Option(help="Task id, for grouping.")] = None,
    group_id: Annotated[str | None, typer.Option(help="Group id.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the rollout is killed.")] = 600,
    admin_token: Annotated[
        str | None, typer.Option(envvar="OPENFORGE_ADMIN_TOKEN", help="The proxy's admin token.")
    ] = None,
) -> None:
    """Run one rollout: register it, run the harness headless, record its end; print a summary."""
    from infra.harnesses import harness
    from infra.harnesses.runner import run_rollout

    result = run_rollout(
        harness(harness_name),
        task,
        proxy,
        root,
        rollout_id=rollout_id,
        model=model,
        timeout_s=timeout,
        task_id=task_id,
        group_id=group_id,
        admin_token=admin_token,
    )
    summary = {
        "rollout_id": result.rollout_id,
        "harness": result.harness,
        "phase": result.phase.value,
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 2),
        "session_id": result.report.session_id,
        "final_message": result.report.final_message,
        "workspace": str(result.dirs.workspace),
        "logs": [str(result.stdout_path), str(result.stderr_path)],
    }
    typer.echo(json.dumps(summary, indent=2))
    if result.exit_code != 0:
        raise typer.Exit(1)
