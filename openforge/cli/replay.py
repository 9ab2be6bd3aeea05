"""``openforge replay``: offline work on a run's archive (``rebuild``: its episodes again)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Offline replay of a run's Parquet archive.", no_args_is_help=True)


@app.command("rebuild")
def rebuild(
    from_: Annotated[
        Path, typer.Option("--from", help="The run's archive (RUN/archive), or the run dir.")
    ],
    to: Annotated[Path, typer.Option(help="New or empty dir for the rebuilt episodes.")],
    lateness: Annotated[
        float | None,
        typer.Option(help="Seconds a rollout waits for its reward (default: the run's)."),
    ] = None,
    check: Annotated[
        bool, typer.Option(help="Compare the rebuilt episodes with the archived ones.")
    ] = True,
    beam_arg: Annotated[
        list[str] | None,
        typer.Option(help="A Beam pipeline option (repeatable); default runner PrismRunner."),
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
