"""Sandbox faults injected into real rollouts (issue 53): the built-in agent in a real sandbox
of each kind, through the proxy, its model a scripted policy (a known plan of commands). The
first command bash runs in a faulted rollout fails once with ``Resource temporarily
unavailable``, before it runs; the agent sees that as the command's result; a policy that runs
it again recovers (reward 1), one that stops does not (reward 0). The fault drawn is recorded
with the rollout's start and the command it hit with its verified end; the orchestrator never
retries a rollout for it. The same rollouts clean (no plan) all score 1, and the paired recovery
table (``openforge query --clean``, ``openforge audit --compare``) reads the two runs' records:
the fault reached the model twice, and one of the two recovered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from infra.harnesses import harness
from infra.harnesses.agent import tool_message
from openforge.audit.fault_recovery import COLUMNS, paired
from openforge.query.source import RunFiles
from openforge.query.views import connect
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, read_events
from orchestrator.environments import SandboxMode
from orchestrator.local import LocalConfig
from orchestrator.rundir import RolloutOutcome, Status
from orchestrator.sandbox_faults import failed
from schemas.archive import ArchiveWriter
from schemas.codec import Record
from schemas.enums import RolloutPhase
from schemas.faults import SANDBOX_FAULT, SANDBOX_FAULTS, FaultKind, FaultPlan, SandboxFault
from schemas.rollout import RolloutEvent
from tests.orchestrator.conftest import job, marked_tasks

WRITE = {"command": "echo data > answer.txt"}
PLANS: dict[str, list[dict[str, Any] | tuple[str, dict[str, Any]]]] = {
    "[again]": [WRITE, WRITE],
    "[once]": [WRITE],
}  # runs it again after an error, or not
EXIT_CODE, UNAVAILABLE = failed(WRITE["command"])
# What the agent says of it to the model: the warm start's recovery demonstrations show this.
SEEN = tool_message("x", {"exit_code": EXIT_CODE, "stdout": "", "stderr": UNAVAILABLE,
                          "timed_out": False})["content"]  # fmt: skip


def _run(
    tmp: Path, model: Path, sandbox: SandboxMode, plan: FaultPlan | None
) -> tuple[dict[str, RolloutOutcome], list[Record], duckdb.DuckDBPyConnection]:
    tasks = marked_tasks(tmp / "tasks", PLANS)
    policy = ScriptedPolicy(model, Script("shell", WRITE, final="Done.", plans=PLANS))
    local = LocalConfig(sandbox=sandbox)
    with (
        serving(policy) as url,
        job(tmp, harness("agent"), model, upstream=url, local=local, faults=plan) as j,
    ):
        records = j.run(tasks)
        j.proxy.flush()
        # 2 rollouts: 4 lifecycle events and a reward each, 3 calls and 2 calls.
        events = read_events(j.proxy.config.log_url, want=15)
    ArchiveWriter(tmp / "archive").write(events)
    by_task = {t.id: t for t in tasks}
    named = {by_task[r.task_id].path.name: r for r in records}
    return named, events, connect(RunFiles.of_archive(tmp / "archive"))


@pytest.mark.parametrize("sandbox", [SandboxMode.BUBBLEWRAP, SandboxMode.CONTAINER])
def test_the_first_command_fails_once_and_a_policy_that_runs_it_again_recovers(
    sandbox: SandboxMode, tiny_model_dir: Path, tmp_path: Path
) -> None:
    plan = FaultPlan({FaultKind.COMMAND_FAILS_ONCE: 1.0}, seed=3)
    records, events, faulted = _run(tmp_path / "faulted", tiny_model_dir, sandbox, plan)
    assert {n: (r.status, r.attempt, r.reward) for n, r in records.items()} == {
        "again": (Status.VERIFIED, 1, 1.0),  # the command again: it ran
        "once": (Status.VERIFIED, 1, 0.0),  # stopped after the error: nothing written
    }
    rollouts = [e for e in events if isinstance(e, RolloutEvent)]
    for name, record in records.items():
        mine = {e.phase: e for e in rollouts if e.rollout_id == record.rollout_id}
        assert mine[RolloutPhase.STARTED].metadata[SANDBOX_FAULT] == "command_fails_once"
        (fired,) = SandboxFault.loads(mine[RolloutPhase.VERIFIED].metadata[SANDBOX_FAULTS])
        assert (fired.kind, fired.command) == (FaultKind.COMMAND_FAILS_ONCE, WRITE["command"])
        assert mine[RolloutPhase.STARTED].at_us <= fired.at_us <= mine[RolloutPhase.VERIFIED].at_us
        # The model saw the fault as the command's result, in the call after it.
        calls = completions_of(events, record.rollout_id)
        request = json.loads(calls[1].request_body or "{}")
        results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
        assert results[0] == SEEN, (name, results)
        assert "bash: echo: Resource temporarily unavailable" in SEEN and "exit code: 126" in SEEN
        if name == "again":  # the second run of the same command was not faulted
            later = json.loads(calls[2].request_body or "{}")
            last = [m["content"] for m in later["messages"] if m["role"] == "tool"][-1]
            assert last.startswith("exit code: 0"), last

    clean, events, twins = _run(tmp_path / "clean", tiny_model_dir, sandbox, None)
    assert {n: r.reward for n, r in clean.items()} == {"again": 1.0, "once": 1.0}
    assert all(SANDBOX_FAULTS not in e.metadata for e in events if isinstance(e, RolloutEvent))

    (row,) = paired(twins, {"faulted": faulted}).rows
    got = dict(zip(COLUMNS, row, strict=True))
    assert {k: got[k] for k in COLUMNS[:10]} == {
        "run": "faulted", "harness": "agent", "kind": "command_fails_once", "pairs": 2,
        "clean_succeeded": 2, "reached_model": 2, "recovery_rate": 0.5, "absorbed": 0,
        "absorbed_recovery_rate": None, "ended": 0,
    }  # fmt: skip
    assert got["retries_per_fault"] == 0.5  # "again" ran the failed command once more
    assert got["recovery_gap"] == 0.5 and got["false_successes"] == 1  # "once" said done
    assert got["recover_s"] is not None and got["recover_s"] > 0
