"""The audit report in the terminal: per section, its tables, compact (a few rows each)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from openforge.audit.queries import Result
from openforge.audit.report import Report


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    return str(value)


def table(result: Result, max_rows: int = 8) -> Table:
    """One result as a compact table: the first ``max_rows`` rows and a count of the rest."""
    t = Table(box=None, pad_edge=False)
    for column in result.columns:
        t.add_column(column, overflow="ellipsis", no_wrap=True, max_width=24)
    for row in result.rows[:max_rows]:
        t.add_row(*(_cell(v) for v in row))
    if not result.rows:
        t.add_row("no data", *([""] * (len(result.columns) - 1)))
    elif len(result.rows) > max_rows:
        t.caption = f"... {len(result.rows) - max_rows} more rows"
    return t


def show(report: Report, console: Console, max_rows: int = 8) -> None:
    """Print the report: the run's record counts, then every section's tables."""
    counts = ", ".join(f"{v} {k}" for k, v in report.counts.items())
    console.print(f"[bold]audit of {report.run}[/]: {counts}")
    for section in report.sections:
        console.rule(section.title, align="left")
        for result in section.tables:
            console.print(f"[bold]{result.query.title}[/] ({len(result.rows)} rows)")
            console.print(table(result, max_rows))
