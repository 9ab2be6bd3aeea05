"""``openforge query``: SQL over a run's Parquet archive, through documented DuckDB views.

An error in the SQL (a syntax error, an unknown view or column) prints DuckDB's message and the
list of views, and exits with status 2, as does a wrong path or option.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from openforge.query.formats import OutputFormat

if TYPE_CHECKING:
    import duckdb


def query(
    sql: Annotated[
        str | None, typer.Argument(help="SQL over the views, e.g. 'SELECT * FROM episodes'.")
    ] = None,
    archive: Annotated[
        Path | None,
        typer.Option(
            help="An archive root (record=NAME/date=.../) or a dir with archive/.",
            resolve_path=True,
        ),
    ] = None,
    run: Annotated[
        Path | None,
        typer.Option(help="A run directory (archive/, episodes/, trainer/).", resolve_path=True),
    ] = None,
    fmt: Annotated[
        OutputFormat, typer.Option("--format", help="How to print the result.")
    ] = OutputFormat.TABLE,
    out: Annotated[
        Path | None,
        typer.Option(help="Write the result to this file (needed for parquet).", resolve_path=True),
    ] = None,
    max_rows: Annotated[
        int, typer.Option(help="Rows a table shows (0: all); other formats write all.")
    ] = 100,
    views: Annotated[
        bool, typer.Option("--views", help="List the views and their columns, then exit.")
    ] = False,
    clean: Annotated[
        Path | None,
        typer.Option(
            help="The clean twin of a faulted --run (openforge rollouts run --fault ...): adds "
            "the views fault_fates (each injected fault, its fate, retries and seconds to "
            "recover) and fault_recovery (recovery paired with the clean run, per harness and "
            "fault kind, as openforge audit --compare shows it).",
            resolve_path=True,
        ),
    ] = None,
) -> None:
    """Run SQL over a run's archive: views completions, tokens, rollouts, rewards, episodes,
    samples, forks, steps (see --views). Example:
    openforge query --run runs/demo "SELECT harness, count(*) FROM completions GROUP BY 1"."""
    from rich.console import Console
    from rich.text import Text

    from schemas.errors import OpenForgeError

    try:
        _query(sql, archive, run, fmt, out, max_rows, views, clean)
    except OpenForgeError as exc:
        # As plain text: DuckDB's messages hold brackets that rich would read as markup.
        message = Text("error: ", style="bold red") + Text(str(exc))
        Console(stderr=True, highlight=False).print(message, soft_wrap=True)
        raise typer.Exit(2) from None


def _query(
    sql: str | None,
    archive: Path | None,
    run: Path | None,
    fmt: OutputFormat,
    out: Path | None,
    max_rows: int,
    views: bool,
    clean: Path | None = None,
) -> None:
    from schemas.errors import ConfigError, SetupError

    try:
        from openforge.query.output import write_result
        from openforge.query.views import describe, execute, open_views
    except ModuleNotFoundError as exc:
        if exc.name != "duckdb":
            raise
        raise SetupError(
            "openforge query needs duckdb: run scripts/setup, or pip install 'openforge[pipeline]'"
        ) from exc
    if views:
        typer.echo(describe(open_views()))
        return
    if sql is None:
        raise ConfigError("give the SQL to run, or --views to list the views")
    if archive is None and run is None:
        raise ConfigError("say what to query: --archive ARCHIVE_ROOT or --run RUN_DIR")
    con = open_views(archive, run=run)
    if clean is not None:
        _add_paired(con, clean, run or archive)
    result = execute(con, sql)
    if result is None:
        return
    rows = write_result(result, fmt, sys.stdout, out, max_rows)
    if out is not None:
        typer.echo(f"{rows} rows written to {out}", err=True)


def _add_paired(con: duckdb.DuckDBPyConnection, clean: Path, faulted: Path | None) -> None:
    """The paired views of ``--clean`` (:func:`openforge.audit.fault_recovery.add_paired_views`)."""
    from openforge.audit.fault_recovery import add_paired_views
    from openforge.audit.report import open_run
    from schemas.errors import ConfigError

    if not clean.exists():
        raise ConfigError(f"--clean {clean}: no such run directory or archive")
    add_paired_views(con, open_run(clean), faulted.name if faulted else "faulted")
