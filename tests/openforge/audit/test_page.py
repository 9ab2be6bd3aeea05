"""The audit page in a real browser: Debian's Chromium (``scripts/setup chromium``) loads the
page headless, lays it out and runs its one inline script, and the DOM it dumps shows every chart
drawn with all its marks on screen; an empty run gives the same charts, each saying "no data".
The command line prints the tables and writes the page, and refuses a step the run lacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from openforge.audit import html
from openforge.audit.report import CHART_NAMES, build
from tests.openforge.audit.conftest import SmallRun, rendered

ROOT = Path(__file__).resolve().parents[3]


def test_every_chart_renders_with_all_its_marks(small_run: SmallRun, tmp_path: Path) -> None:
    page = html.write(build(small_run.path), tmp_path / "audit.html")
    dom = rendered(page, tmp_path)
    assert [c["data-chart"] for c in dom.charts] == list(CHART_NAMES)
    for chart in dom.charts:
        marks = int(chart["data-marks"] or 0)
        assert marks > 0, chart  # the run has data for every chart
        assert chart["data-rendered-marks"] == str(marks), chart  # each one laid out on screen
    assert dom.no_data == 0
    assert dom.external == []  # self-contained: nothing is fetched


def test_an_empty_run_gives_every_chart_as_no_data(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "trainer").mkdir(parents=True)  # a run that has produced nothing yet
    page = html.write(build(run), tmp_path / "audit.html")
    dom = rendered(page, tmp_path)
    assert [c["data-chart"] for c in dom.charts] == list(CHART_NAMES)
    assert {c["data-marks"] for c in dom.charts} == {"0"}
    assert dom.no_data == len(CHART_NAMES)


def test_the_command_prints_tables_writes_the_page_and_refuses_a_missing_step(
    small_run: SmallRun, tmp_path: Path
) -> None:
    cli = [sys.executable, "-m", "openforge", "audit", str(small_run.path)]
    out = tmp_path / "page" / "audit.html"
    done = subprocess.run(
        [*cli, "--html", str(out), "--step", "2"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Lineage of step 2" in done.stdout and "Tool-call usage" in done.stdout
    assert "ro-5" in done.stdout  # the rollout without a reward is named
    assert out.read_text().count('class="chart"') == len(CHART_NAMES)
    bad = subprocess.run([*cli, "--step", "9"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1
    assert "steps 1 to 3" in bad.stderr and "Traceback" not in bad.stderr
