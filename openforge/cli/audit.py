"""``openforge audit RUN``: the saved audit queries over a run, printed as compact tables and,
with ``--html FILE``, written as one self-contained HTML page of charts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def audit(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="A run directory (archive/, episodes/, trainer/); with --compare, two or more.",
            resolve_path=True,
        ),
    ],
    compare: Annotated[
        bool, typer.Option("--compare", help="Compare the runs side by side.")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            help="Also write the report as one HTML page to this file.", resolve_path=True
        ),
    ] = None,
    step: Annotated[
        int | None, typer.Option(help="The training step whose lineage is shown (default: last).")
    ] = None,
    max_rows: Annotated[int, typer.Option(help="Rows each terminal table shows.")] = 8,
    rollout: Annotated[
        str | None,
        typer.Option(help="The rollout whose screenshots the page shows (default: the most)."),
    ] = None,
    image_dir: Annotated[
        Path | None,
        typer.Option(
            help="The proxy's image store (default: the run's log/images).", resolve_path=True
        ),
    ] = None,
) -> None:
    """Audit a run: reward per step, task, harness and policy version; continuity and fork
    classes; staleness and IS weights; latency; tool calls; screenshots of a rollout's steps;
    failures; a step's lineage; cost per rollout, utilisation and what bounded the run. With
    --compare, runs side by side."""
    from rich.console import Console

    from openforge.audit import html as page
    from openforge.audit.compare import compare as compared
    from openforge.audit.report import build
    from openforge.audit.terminal import show
    from schemas.errors import ConfigError

    if compare:
        report = compared(runs)
    elif len(runs) != 1:
        raise ConfigError(
            f"{len(runs)} runs given: audit one run, or compare runs with "
            "`openforge audit --compare RUN_A RUN_B`"
        )
    else:
        report = build(runs[0], step, rollout, image_dir)
    show(report, Console(soft_wrap=True), max_rows)
    if html is not None:
        typer.echo(f"wrote {page.write(report, html)}")
