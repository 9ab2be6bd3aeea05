"""``openforge audit --compare``: two runs side by side, in the terminal and on one page that
headless Chromium draws with every chart's marks; a wrong number of runs is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openforge.audit import html
from openforge.audit.compare import CHART_NAMES, compare, labels
from openforge.audit.fault_recovery import PAIRED
from tests.openforge.audit.conftest import SmallRun, rendered, verified_costs, write_run

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> SmallRun:
    return write_run(tmp_path_factory.mktemp("other") / "run")


def test_two_runs_side_by_side_on_one_page(
    small_run: SmallRun, other_run: SmallRun, tmp_path: Path
) -> None:
    report = compare([small_run.path, other_run.path])
    a, b = labels([small_run.path, other_run.path])
    assert a != b and report.counts == {
        f"verified rollouts of {a}": 8,
        f"verified rollouts of {b}": 8,
    }
    costs = next(s for s in report.sections if s.title.startswith("Cost per rollout")).tables[0]
    (row_a, row_b) = costs.rows
    # The eight verified rollouts' mean phases, the same in both (the same records).
    seeds = [s for s in range(1, 10) if s != 5]
    for phase in ("queued_s", "prepare_s", "verifier_s"):
        mean = sum(verified_costs(s)[phase] for s in seeds) / len(seeds)
        assert row_a[costs.columns.index(phase)] == pytest.approx(mean), phase
    assert row_a[1:] == row_b[1:] and row_a[1] == len(seeds)
    # The second run's one injected fault (a slow first byte: the call still ended ok) pairs
    # with the first run's same rollout: nothing to recover from, and no gap.
    faults = next(s for s in report.sections if s.title == PAIRED.title).tables[0]
    (row,) = [dict(zip(faults.columns, r, strict=True)) for r in faults.rows]
    assert (row["run"], row["kind"], row["pairs"], row["clean_succeeded"]) == (
        b,
        "slow_first_byte",
        1,
        1,
    )
    assert (row["absorbed"], row["absorbed_recovery_rate"], row["reached_model"]) == (1, 1.0, 0)
    assert (row["retries_per_fault"], row["recovery_gap"], row["false_successes"]) == (0, 0, 0)
    dom = rendered(html.write(report, tmp_path / "compare.html"), tmp_path)
    assert [c["data-chart"] for c in dom.charts] == list(CHART_NAMES)
    for chart in dom.charts:
        assert int(chart["data-marks"] or 0) > 0, chart
        assert chart["data-rendered-marks"] == chart["data-marks"], chart


def test_the_command_compares_and_refuses_a_wrong_number_of_runs(
    small_run: SmallRun, other_run: SmallRun, tmp_path: Path
) -> None:
    cli = [sys.executable, "-m", "openforge", "audit"]
    out = tmp_path / "compare.html"
    runs = [str(small_run.path), str(other_run.path)]
    done = subprocess.run(
        [*cli, "--compare", *runs, "--html", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Busy fractions, by run" in done.stdout and out.read_text().count(
        'class="chart"'
    ) == len(CHART_NAMES)
    two = subprocess.run([*cli, *runs], capture_output=True, text=True, cwd=ROOT)
    said = " ".join(two.stderr.split())
    assert two.returncode == 1 and "openforge audit --compare RUN_A RUN_B" in said
    one = subprocess.run([*cli, "--compare", runs[0]], capture_output=True, text=True, cwd=ROOT)
    assert one.returncode == 1 and "needs two runs or more" in " ".join(one.stderr.split())


def test_each_run_gets_a_label_of_its_own() -> None:
    a, b = Path("/x/one/run"), Path("/x/two/run")
    assert labels([a, Path("/x/other")]) == ["run", "other"]
    assert labels([a, b]) == ["one/run", "two/run"]
    assert labels([a, a, a]) == ["one/run", "one/run (2)", "one/run (3)"]
