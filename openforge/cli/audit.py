"""``openforge audit RUN``: the saved audit queries over a run, printed as compact tables and,
with ``--html FILE``, written as one self-contained HTML page of charts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def audit(
    run: Annotated[
        Path,
        typer.Argument(help="A run directory (archive/, episodes/, trainer/).", resolve_path=True),
    ],
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
) -> None:
    """Audit a run: reward per step, task, harness and policy version; continuity and fork
    classes; staleness and IS weights; latency; tool calls; failures; a step's lineage."""
    from rich.console import Console

    from openforge.audit import html as page
    from openforge.audit.report import build
    from openforge.audit.terminal import show

    report = build(run, step)
    show(report, Console(), max_rows)
    if html is not None:
        typer.echo(f"wrote {page.write(report, html)}")
