"""Paired recovery from injected faults (issue 53, item 3): the same held-out echo-words tasks
played clean and with the proxy answering a share of calls 503, by the built-in agent on the
demo's warm start (before its noisy phase: it writes the instructed word), in real sandboxes on
real vLLM; ``openforge audit --compare CLEAN FAULTED`` pairs the rollouts and its table says
what the runs' own records say. Then the fates and pairing as properties."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.harnesses import Agent
from infra.local.vllm import VLLMServer
from infra.tasks import load_dataset
from openforge.audit.compare import compare
from openforge.audit.fault_recovery import FATES, PAIRED, Played, faults_of, pair
from openforge.audit.report import open_run
from openforge.query.log_archive import archive_log
from openforge.train.config_io import load_config
from openforge.train.launch import base_model, prepare_model
from openforge.train.warmstart import exact_dir
from orchestrator.rundir import Status
from schemas.faults import FaultKind, FaultPlan
from tests.orchestrator.conftest import ROOT, job

DEMO = load_config(ROOT / "examples" / "cpu-demo.toml")


@pytest.fixture(scope="module")
def copier() -> Iterator[VLLMServer]:
    """vLLM on the demo's warm start before its noisy phase (cached by scripts/setup's
    demo-model part; built here otherwise)."""
    demo = prepare_model(DEMO, say=lambda _: None)  # makes the phases before the noise too
    exact = exact_dir(base_model(DEMO), DEMO.warm_start, demo.parent)
    with VLLMServer(exact, served_model_name="tiny") as server:
        yield server


def _play(copier: VLLMServer, tiny: Path, out: Path, plan: FaultPlan | None) -> dict[Any, float]:
    """Held-out echo-words tasks, two samples each, clean or under ``plan``: the reward of each
    rollout (the same ids in both runs: the same tasks and samples), the run archived under
    ``out``."""
    tasks = load_dataset(ROOT / "examples" / "echo-words", split="heldout")[:4]
    agent = Agent(max_turns=DEMO.harness.max_turns, max_tokens=DEMO.harness.max_tokens, retries=6)
    with job(out, agent, tiny, upstream=copier.base_url, faults=plan) as j:
        records = j.run(tasks, n=2)
        j.proxy.flush()
        archive_log(j.proxy.config.log_url, out / "archive")  # as `rollouts run` does
    assert all(r.status is Status.VERIFIED and r.attempt == 1 for r in records), records
    return {r.rollout_id: float(r.reward or 0) for r in records}


def test_a_faulted_run_pairs_with_its_clean_twin_and_the_table_says_what_its_records_say(
    copier: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    clean = _play(copier, tiny_model_dir, tmp_path / "clean", None)
    plan = FaultPlan({FaultKind.HTTP_503: 0.5}, seed=5, retry_after_s=0)
    faulted = _play(copier, tiny_model_dir, tmp_path / "faulted", plan)
    assert any(clean.values()), clean  # the warm start writes the word: some succeed

    report = compare([tmp_path / "clean", tmp_path / "faulted"])
    section = next(s for s in report.sections if s.title == PAIRED.title)
    (table,) = section.tables
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    assert [(r["harness"], r["kind"]) for r in rows] == [("agent", "http_503")], rows
    (row,) = rows
    # The agent retries every 503 (its own retries): none reaches the model or ends a rollout.
    assert (row["reached_model"], row["ended"], row["recovery_rate"]) == (0, 0, None)
    assert row["retries_per_fault"] >= 1 and row["recover_s"] > 0
    # What the runs' own records say: the rollouts a fault hit, their twins' rewards and theirs.
    con = open_run(tmp_path / "faulted")
    sql = "SELECT DISTINCT rollout_id FROM completions WHERE fault IS NOT NULL"
    hit = {str(r) for (r,) in con.sql(sql).fetchall()}
    assert hit and row["pairs"] == len(hit)
    twins_ok = [r for r in hit if clean[r] > 0]
    assert row["clean_succeeded"] == row["absorbed"] == len(twins_ok)
    if twins_ok:
        rate = sum(faulted[r] > 0 for r in twins_ok) / len(twins_ok)
        assert row["absorbed_recovery_rate"] == pytest.approx(rate)
    gap = sum(clean[r] - faulted[r] for r in hit) / len(hit)
    assert row["recovery_gap"] == pytest.approx(gap)

    # The same through `openforge query`, as a user types it (relative paths): the paired
    # table, and each injected fault with its fate.
    def query(sql: str) -> list[dict[str, Any]]:
        argv = [sys.executable, "-m", "openforge", "query", "--run", "faulted", "--clean", "clean"]
        done = subprocess.run(
            [*argv, "--format", "json", sql], cwd=tmp_path, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    (queried,) = query("SELECT * FROM fault_recovery")
    assert queried == {**row, "run": "faulted"}
    fates = query("SELECT rollout_id, fate, retries FROM fault_fates")
    assert {f["rollout_id"] for f in fates} == hit
    assert {f["fate"] for f in fates} == {FATES[1]} and all(f["retries"] >= 1 for f in fates)


_CALL = st.fixed_dictionaries(
    {
        "fault": st.sampled_from([None, None, "http_503", "stream_cut", "slow_first_byte"]),
        "ok": st.booleans(),
        "retries": st.integers(0, 2),  # how many later calls name it as retried
    }
)


@given(st.lists(_CALL, max_size=8))
def test_each_fault_has_one_fate_read_from_the_calls_after_it(spec: list[dict[str, Any]]) -> None:
    calls: list[dict[str, Any]] = []

    def call(event_id: str, fault: str | None, status: str, retry_of: str | None) -> None:
        at = len(calls) * 10**6
        calls.append(
            {"rollout_id": "r", "event_id": event_id, "fault": fault, "status": status,
             "received_us": at, "done_us": at + 5, "retry_of": retry_of}
        )  # fmt: skip

    for i, c in enumerate(spec):
        ok = c["ok"] or c["fault"] == "slow_first_byte"
        call(f"e{i}", c["fault"], "ok" if ok else "upstream_error", None)
    for i, c in enumerate(spec):  # the retries of call i, after every call
        for k in range(c["retries"] if calls[i]["status"] != "ok" else 0):
            call(f"e{i}-r{k}", None, "ok", f"e{i}")
    faults = faults_of(calls)
    hit = [(i, c) for i, c in enumerate(calls) if c["fault"]]
    assert len(faults) == len(hit)
    for fault, (i, call) in zip(faults, hit, strict=True):
        retried = sum(c["retry_of"] == call["event_id"] for c in calls)
        assert fault.retries == retried and fault.kind == call["fault"]
        expected = (
            FATES[0] if call["status"] == "ok"
            else FATES[1] if retried
            else FATES[2] if i + 1 < len(calls)
            else FATES[3]
        )  # fmt: skip
        assert fault.fate == expected
        later_ok = [c for c in calls[i + 1 :] if c["status"] == "ok"]
        assert (fault.recover_s is None) == (not later_ok)


_PLAYED = st.builds(
    lambda i, task, sample, reward: Played(f"r{i}", (task, "agent", sample, 0), reward, False),
    st.integers(0, 10**6),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["0", "1"]),
    st.sampled_from([0.0, 1.0]),
)


@given(st.lists(_PLAYED, max_size=8), st.lists(_PLAYED, max_size=8))
def test_each_faulted_rollout_pairs_with_a_clean_one_of_its_key_at_most_once(
    clean: list[Played], faulted: list[Played]
) -> None:
    pairs = pair(clean, faulted)
    assert all(c.key == f.key for c, f in pairs)  # versions known on both sides: exact
    assert len({id(c) for c, _ in pairs}) == len(pairs) == len({id(f) for _, f in pairs})
    for key in {p.key for p in faulted}:
        want = min(sum(p.key == key for p in clean), sum(p.key == key for p in faulted))
        assert sum(f.key == key for _, f in pairs) >= want  # exact keys first


@given(st.lists(_PLAYED, max_size=6), st.lists(_PLAYED, max_size=6))
def test_a_faulted_rollout_of_unknown_version_pairs_by_task_harness_and_sample(
    clean: list[Played], faulted: list[Played]
) -> None:
    """A fault that failed every call of a rollout left it no tokens, so no policy version."""
    unknown = [Played(f.rollout_id, (*f.key[:3], None), f.reward, False) for f in faulted]
    pairs = pair(clean, unknown)
    assert all(c.key[:3] == f.key[:3] for c, f in pairs)
    for key in {f.key[:3] for f in unknown}:
        want = min(sum(c.key[:3] == key for c in clean), sum(f.key[:3] == key for f in unknown))
        assert sum(f.key[:3] == key for _, f in pairs) == want
