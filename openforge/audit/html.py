"""The audit report as one self-contained HTML page: inline CSS, inline SVG charts, no file,
script or font from anywhere else. One short inline script measures, once the page has been laid
out, how many of each chart's marks have a non-zero size on screen, and writes it to the chart's
``data-rendered-marks`` attribute (what a test reads from the browser's DOM)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from openforge.audit.queries import Result
from openforge.audit.report import Report, Section
from openforge.audit.terminal import _cell

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
nav a { margin-right: 1em; font-size: 0.9em; }
p.doc { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.6em 0; }
th, td { padding: 2px 8px; border-bottom: 1px solid #eee; text-align: left; }
th { background: #f6f6f6; }
details { font-size: 0.8em; color: #555; } pre { background: #f6f6f6; padding: 0.5em; }
svg.chart { display: block; margin: 0.5em 0; font-family: sans-serif; }
"""

_MEASURE = """
window.addEventListener("load", function () {
  document.querySelectorAll("svg.chart").forEach(function (svg) {
    var drawn = 0;
    svg.querySelectorAll(".mark").forEach(function (m) {
      var box = m.getBoundingClientRect();
      if (box.width > 0 && box.height > 0) { drawn += 1; }
    });
    svg.setAttribute("data-rendered-marks", String(drawn));
  });
  document.body.setAttribute("data-measured", "yes");
});
"""


def _table(result: Result, max_rows: int) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in result.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>"
        for row in result.rows[:max_rows]
    )
    more = (
        f"<p class='doc'>... {len(result.rows) - max_rows} more rows</p>"
        if len(result.rows) > max_rows
        else ""
    )
    sql = escape(textwrap.dedent(result.query.sql).strip())
    return (
        f"<details><summary>{escape(result.query.title)} ({len(result.rows)} rows; query "
        f"<code>{escape(result.query.name)}</code>)</summary><p>{escape(result.query.doc)}</p>"
        f"<pre>{sql}</pre></details><table><tr>{head}</tr>{rows}</table>{more}"
    )


def _section(i: int, section: Section, max_rows: int) -> str:
    tables = "".join(_table(t, max_rows) for t in section.tables)
    return (
        f'<section id="s{i}"><h2>{escape(section.title)}</h2>'
        f'<p class="doc">{escape(section.doc)}</p>{section.chart.svg}{tables}</section>'
    )


def page(report: Report, max_rows: int = 12) -> str:
    """The whole page, as text."""
    counts = ", ".join(f"{v} {escape(k)}" for k, v in report.counts.items())
    nav = "".join(f'<a href="#s{i}">{escape(s.title)}</a>' for i, s in enumerate(report.sections))
    body = "".join(_section(i, s, max_rows) for i, s in enumerate(report.sections))
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = escape(_shown(report.run))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>OpenForge audit: {run}</title><style>{_CSS}</style>"
        f"<script>{_MEASURE}</script></head><body>"
        f"<h1>Audit of {run}</h1>"
        f"<p class='doc'>{counts}; written {when} by <code>openforge audit</code>. Every "
        "table's query runs as is in <code>openforge query --run RUN</code>.</p>"
        f"<nav>{nav}</nav>{body}</body></html>\n"
    )


def write(report: Report, path: Path) -> Path:
    """Write the page to ``path`` (its directory is made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(report))
    return path


def _shown(run: object) -> str:
    """The run as its user names it: relative to the working directory when it is under it
    (``runs/cpu-demo``), not the machine's absolute path."""
    path = Path(str(run))
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(run)
