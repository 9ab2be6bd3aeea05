"""Error recovery read from recorded calls: the tool results of each dialect, and a real run
(the built-in agent in containers, the proxy, the event log) of a scripted policy that makes
known errors and recovers from a known share of them, asserted exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.harnesses import harness
from openforge.audit.recovery import is_error, recovery, rollout_errors, tool_calls, tool_results
from openforge.query.source import RunFiles
from openforge.query.views import connect
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import read_events
from orchestrator.rundir import Status
from schemas.archive import ArchiveWriter
from tests.orchestrator.conftest import job, marked_tasks

FAIL = {"command": "cat notes.txt"}  # the workspace has no notes.txt
WRITE = {"command": "echo data > answer.txt"}
PLANS: dict[str, list[dict[str, Any] | tuple[str, dict[str, Any]]]] = {
    "[recover]": [FAIL, WRITE],  # changed approach, recovered
    "[retry]": [FAIL, FAIL, WRITE],  # retried, then changed approach, recovered
    "[give-up]": [FAIL],  # answered right after the error: ended the rollout, reward 0
    "[clean]": [WRITE],  # no error
}


def test_tool_results_and_calls_in_each_dialect() -> None:
    chat = {"messages": [{"role": "tool", "tool_call_id": "c1", "content": "exit code: 2\n"}]}
    assert tool_results("chat", chat) == [("c1", "exit code: 2\n", False)]
    responses = {"input": [{"type": "function_call_output", "call_id": "f1", "output": "ok"}]}
    assert tool_results("responses", responses) == [("f1", "ok", False)]
    blocks = [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
               "content": [{"type": "text", "text": "denied"}]}]  # fmt: skip
    messages = {"messages": [{"role": "user", "content": blocks}]}
    assert tool_results("messages", messages) == [("t1", "denied", True)]
    answer = {"content": [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {"a": 1}}]}
    assert tool_calls("messages", answer) == [("t2", "Bash", '{"a": 1}')]
    out = {
        "output": [{"type": "function_call", "call_id": "f2", "name": "shell", "arguments": "{}"}]
    }
    assert tool_calls("responses", out) == [("f2", "shell", "{}")]
    for text in ("exit code: 1", "Traceback (most recent call last):", "x: command not found",
                 "cat: a: No such file or directory", "error: bad"):  # fmt: skip
        assert is_error(text, False), text
    assert not is_error("exit code: 0\nstdout:\nhi", False) and is_error("fine", True)


def _call(
    i: int, request: list[dict[str, object]], tool: dict[str, str] | None
) -> dict[str, object]:
    calls = [{"id": f"c{i}", "function": tool}] if tool else []
    response = {"choices": [{"message": {"tool_calls": calls}}]}
    return {
        "dialect": "chat",
        "received_us": i * 10**6,
        "request_body": json.dumps({"messages": request}),
        "response_body": json.dumps(response),
    }


def test_what_followed_each_error_and_when_it_recovered() -> None:
    ls = {"name": "shell", "arguments": '{"command": "ls x"}'}
    echo = {"name": "shell", "arguments": '{"command": "echo"}'}
    failed = {"role": "tool", "content": "exit code: 2"}
    calls = [
        _call(0, [], ls),
        _call(1, [{**failed, "tool_call_id": "c0"}], ls),  # the same call again: retried
        _call(2, [{**failed, "tool_call_id": "c1"}], echo),  # another call: changed approach
        _call(3, [{"role": "tool", "tool_call_id": "c2", "content": "exit code: 0"}], None),
    ]
    errors = rollout_errors("r", calls)
    assert [(e.tool, e.then) for e in errors] == [
        ("shell", "retried"),
        ("shell", "changed approach"),
    ]
    assert [e.recovered_after_s for e in errors] == [2.0, 1.0]  # to call 3, which carried a success
    gave_up = rollout_errors(
        "r", [_call(0, [], ls), _call(1, [{**failed, "tool_call_id": "c0"}], None)]
    )
    assert [e.then for e in gave_up] == ["ended the rollout"] and gave_up[
        0
    ].recovered_after_s is None


def test_a_scripted_policy_recovers_a_known_share_of_its_errors(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tasks = marked_tasks(tmp_path / "tasks", PLANS)
    policy = ScriptedPolicy(tiny_model_dir, Script("shell", WRITE, final="Done.", plans=PLANS))
    with serving(policy) as url, job(tmp_path, harness("agent"), tiny_model_dir, upstream=url) as j:
        records = j.run(tasks)
        j.proxy.flush()
        ArchiveWriter(tmp_path / "archive").write(read_events(j.proxy.config.log_url, want=30))
    assert {(r.task_id, r.status) for r in records} == {(t.id, Status.VERIFIED) for t in tasks}
    table = recovery(connect(RunFiles.of_archive(tmp_path / "archive")))
    (row,) = table.rows
    got = dict(zip(table.columns, row, strict=True))
    # 4 rollouts, 3 with an error, 4 errors: 1 retried, 2 changed approach, 1 ended the rollout;
    # 2 of the 3 recovered (reward 1), the one that gave up got 0; the clean one 1.
    assert {k: got[k] for k in table.columns[:9]} == {
        "harness": "agent", "policy_version": 0, "rollouts": 4, "with_errors": 3, "errors": 4,
        "retried": 1, "changed approach": 2, "gave up": 0, "ended the rollout": 1,
    }  # fmt: skip
    assert got["recovery_rate"] == pytest.approx(2 / 3)
    assert got["reward_with_errors"] == pytest.approx(2 / 3) and got["reward_without"] == 1.0
    assert got["recover_s"] is not None and got["recover_s"] > 0
