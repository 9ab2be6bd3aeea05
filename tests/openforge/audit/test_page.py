"""The audit page in a real browser: Debian's Chromium (``scripts/setup chromium``) loads the
page headless, lays it out and runs its one inline script, and the DOM it dumps shows every chart
drawn with all its marks on screen; an empty run gives the same charts, each saying "no data".
The command line prints the tables and writes the page, and refuses a step the run lacks."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from openforge.audit import html
from openforge.audit.report import CHART_NAMES, build
from schemas.errors import ConfigError
from tests.openforge.audit.conftest import SmallRun, rendered, screenshot

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


def test_the_page_shows_a_chosen_rollouts_screenshots_from_the_image_store(
    small_run: SmallRun, tmp_path: Path
) -> None:
    """The chat harness's rollouts showed a screenshot each call: the page shows the newest
    image of each call of the chosen rollout (default: the one with the most; ties by id),
    inline, with the actions the model answered; without the store, each says so."""
    report = build(small_run.path)
    (section,) = [s for s in report.sections if s.chart.name == "screenshots"]
    calls = Counter(row[0] for row in section.tables[0].rows)
    assert calls == {"ro-2": 5, "ro-5": 8, "ro-8": 8}  # the chat harness's rollouts
    assert section.title == "Screenshots of rollout ro-5"  # the most calls, first by id
    default = rendered(html.write(report, tmp_path / "a.html"), tmp_path)
    assert [base64.b64decode(url.split(",", 1)[1]) for url in default.images] == [
        screenshot("ro-5", k) for k in range(8)
    ]
    chosen = build(small_run.path, rollout="ro-8")
    (section,) = [s for s in chosen.sections if s.chart.name == "screenshots"]
    assert section.title == "Screenshots of rollout ro-8" and section.chart.marks == 8
    assert "call 0: bash {}" in section.chart.svg  # the action answered on that screenshot
    elsewhere = build(small_run.path, rollout="ro-8", image_dir=tmp_path / "no-store")
    (missing,) = [s for s in elsewhere.sections if s.chart.name == "screenshots"]
    assert missing.chart.marks == 0 and missing.chart.svg.count("image not stored") == 8
    with pytest.raises(ConfigError, match="rollouts with screenshots: ro-2, ro-5, ro-8"):
        build(small_run.path, rollout="ro-1")
