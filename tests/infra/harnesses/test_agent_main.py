"""The built-in agent's tool, without a model: commands run in the workspace under a timeout
that takes down everything they started, and malformed calls come back as error texts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.harnesses import agent_main


def test_a_command_runs_in_the_workspace_without_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(agent_main.API_KEY_ENV, "ofk-secret")
    script = f'pwd; echo "key=${agent_main.API_KEY_ENV}"; echo err >&2; exit 3'
    got = agent_main.run_shell(script, tmp_path, 10, 1000)
    assert got["exit_code"] == 3 and not got["timed_out"]
    assert got["stdout"] == f"{tmp_path}\nkey=\n" and got["stderr"] == "err\n"


def test_the_timeout_kills_the_whole_command(tmp_path: Path) -> None:
    start = time.monotonic()
    # A background child keeps the output pipe open: killing bash alone would hang the read.
    got = agent_main.run_shell("sleep 30 & sleep 30; echo never", tmp_path, 1.0, 1000)
    assert got["timed_out"] and got["exit_code"] != 0
    assert time.monotonic() - start < 10 and "never" not in got["stdout"]


def test_long_output_is_cut_in_the_middle(tmp_path: Path) -> None:
    got = agent_main.run_shell("seq 1 100000", tmp_path, 10, 200)
    assert got["stdout"].startswith("1\n2\n") and got["stdout"].endswith("100000\n")
    assert "\n[...]\n" in got["stdout"] and len(got["stdout"]) < 220


def test_malformed_calls_come_back_as_errors(tmp_path: Path) -> None:
    def result(name: str, arguments: str) -> str:
        call = {"id": "c1", "name": name, "arguments": arguments}
        return agent_main.tool_result(call, tmp_path, 10, 1000)

    assert result("python", "{}").startswith("error: unknown tool 'python'")
    assert result("shell", "not json").startswith("error: the arguments must be")
    assert result("shell", json.dumps({"cmd": "ls"})).startswith("error: the arguments must be")
    ok = result("shell", json.dumps({"command": "printf hi > f.txt; echo done"}))
    assert (
        ok.startswith("exit code: 0\nstdout:\ndone\n") and (tmp_path / "f.txt").read_text() == "hi"
    )
