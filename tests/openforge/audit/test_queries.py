"""The audit's saved queries over a small run whose contents are known: each returns what was
written (rewards per step, task, harness and version; held-out rewards; continuity and fork
classes; staleness; IS weights; latency; tool calls; failures; a step's lineage), and over a run
with nothing in it each returns no rows and its chart says "no data"."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import mean

import pyarrow.parquet as pq
import pytest

from openforge.audit.queries import BY_NAME, QUERIES, Result, run, run_all
from openforge.audit.report import CHART_NAMES, build
from openforge.query.source import RunFiles
from openforge.query.views import connect
from schemas.archive import archive_files
from schemas.errors import ConfigError
from tests.openforge.audit.conftest import SmallRun


@pytest.fixture(scope="module")
def results(small_run: SmallRun) -> dict[str, Result]:
    return run_all(connect(RunFiles.of_run(small_run.path)), step=3)


def _rows(results: dict[str, Result], name: str) -> list[tuple[object, ...]]:
    return results[name].rows


def test_rewards_per_step_and_held_out(small_run: SmallRun, results: dict[str, Result]) -> None:
    reward = {e.episode_id: e.reward for e in small_run.episodes}
    expected = [
        (step, len(ids), pytest.approx(mean(reward[i] or 0.0 for i in ids)))
        for step, ids in small_run.steps.items()
    ]
    assert _rows(results, "train_reward_per_step") == expected
    ((version, n, _),) = _rows(results, "heldout_reward_per_version")
    assert (version, n) == (2, len(small_run.heldout))


def test_rewards_by_task_harness_and_version(results: dict[str, Result]) -> None:
    # 8 of the 9 rollouts have a reward (ro-5 has none); harnesses cycle agent, codex, claude.
    by_task = {t: n for t, n, _ in _rows(results, "reward_by_task")}
    assert by_task == {"task-0": 2, "task-1": 2, "task-2": 2, "task-3": 2}
    by_harness = {h: n for h, n, _ in _rows(results, "reward_by_harness")}
    assert by_harness == {"agent": 2, "codex": 3, "claude-code": 3}
    # Trainable episodes only: versions 0 (ro-1..3), 1 (ro-4, ro-6), 2 (the held-out ro-8, 9).
    assert [(v, n) for v, n, _ in _rows(results, "reward_by_policy_version")] == [
        (0, 3),
        (1, 2),
        (2, 2),
    ]


def test_continuity_and_fork_classes(small_run: SmallRun, results: dict[str, Result]) -> None:
    con = connect(RunFiles.of_run(small_run.path))
    main = con.sql(
        "SELECT harness, continuity, count(*) FROM completions WHERE NOT side_call GROUP BY ALL"
    ).fetchall()
    assert sorted(_rows(results, "continuity_by_harness")) == sorted(main)
    forks = Counter((e.harness, str(f.mismatch)) for e in small_run.written for f in e.forks)
    got = Counter({(h, m): n for h, m, n in _rows(results, "fork_classes_by_harness")})
    assert got == forks and len({m for _, m in got}) >= 3


def test_staleness_and_is_weights(results: dict[str, Result]) -> None:
    # The trainer held versions 0, 1, 2 before steps 1, 2, 3; step 3 retrains ro-2, ro-3
    # (version 0: lag 2) and ro-4 (version 1: lag 1).
    assert _rows(results, "staleness") == [(0, 5), (1, 1), (2, 2)]
    assert [r[0] for r in _rows(results, "is_weights_per_step")] == [1, 2, 3]
    assert _rows(results, "is_weights_per_step")[0][1:] == pytest.approx((0.7, 1.0, 1.3))


def test_latency_and_tool_calls(small_run: SmallRun, results: dict[str, Result]) -> None:
    calls = {d: n for d, n, *_ in _rows(results, "latency_by_dialect")}
    assert set(calls) == {"chat", "messages", "responses"}
    assert (
        sum(calls.values())
        == connect(RunFiles.of_run(small_run.path))
        .sql("SELECT count(*) FROM completions")
        .fetchall()[0][0]
    )
    # ttft is 20 ms x (1 + seed % 3): one value per harness, so every percentile is it.
    ttft = {d: (p50, p99) for d, _, p50, _, p99, *_ in _rows(results, "latency_by_dialect")}
    assert ttft == {"chat": (60.0, 60.0), "responses": (20.0, 20.0), "messages": (40.0, 40.0)}
    tools = {(h, t) for h, t, _ in _rows(results, "tool_calls")}
    assert tools == {("agent", "bash"), ("codex", "shell"), ("claude-code", "Edit")}


def test_tool_calls_count_each_event_once(small_run: SmallRun) -> None:
    # Every other call's response holds one tool call; duplicate deliveries count once.
    events: dict[str, str] = {}
    for path in archive_files(small_run.path / "archive", "completion"):
        for row in pq.read_table(path).to_pylist():
            if row["response_body"] and not row["side_call"]:
                events[row["event_id"]] = row["harness"]
    con = connect(RunFiles.of_run(small_run.path))
    got = Counter({h: n for h, _, n in run(con, BY_NAME["tool_calls"]).rows})
    assert got == Counter(events.values())


def test_actions_per_rollout_count_each_rollouts_tool_calls(small_run: SmallRun) -> None:
    # Every other call's response holds one tool call; duplicate deliveries count once; a
    # rollout whose calls made none is in the 0 bar.
    calls: dict[str, tuple[str, str, bool]] = {}  # event -> (rollout, harness, has a tool call)
    for path in archive_files(small_run.path / "archive", "completion"):
        for row in pq.read_table(path).to_pylist():
            if not row["side_call"]:
                body = str(row["response_body"] or "")
                called = any(k in body for k in ('"tool_calls"', '"function_call"', '"tool_use"'))
                calls[row["event_id"]] = (row["rollout_id"], row["harness"], called)
    per: dict[str, tuple[str, int]] = {}
    for rollout, harness, called in calls.values():
        per[rollout] = (harness, per.get(rollout, (harness, 0))[1] + int(called))
    want = Counter(per.values())
    con = connect(RunFiles.of_run(small_run.path))
    got = Counter({(h, a): n for h, a, n in run(con, BY_NAME["actions_per_rollout"]).rows})
    assert got == want and sum(got.values()) == len(per)
    assert len({a for _, a in got}) >= 2  # rollouts with different numbers of actions


def test_failures_and_lineage(small_run: SmallRun, results: dict[str, Result]) -> None:
    assert [r[0] for r in _rows(results, "rollouts_without_reward")] == small_run.unrewarded
    assert [r[0] for r in _rows(results, "dead_letters")] == small_run.dead
    lineage = results["step_lineage"]
    assert sorted(lineage.column("episode_id")) == sorted(small_run.steps[3])
    assert set(lineage.column("step")) == {3}


def test_an_empty_run_has_no_rows_and_no_data_charts(tmp_path: Path) -> None:
    (tmp_path / "trainer").mkdir()
    empty = run_all(connect(RunFiles.of_run(tmp_path)))
    assert set(empty) == {q.name for q in QUERIES}
    assert all(r.rows == [] for r in empty.values())
    report = build(tmp_path)
    assert report.step is None
    assert [s.chart.name for s in report.sections] == list(CHART_NAMES)
    assert all(s.chart.marks == 0 and "no data" in s.chart.svg for s in report.sections)
    with pytest.raises(ConfigError, match="no training steps"):
        build(tmp_path, step=1)
