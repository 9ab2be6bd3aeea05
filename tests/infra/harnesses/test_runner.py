"""The local rollout runner: deadlines, process clean-up and the recorded rollout end."""

from __future__ import annotations

import json
from pathlib import Path

from infra.harnesses import OpenClaw
from infra.harnesses.runner import run_rollout
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from schemas.enums import RolloutPhase
from schemas.rollout import RolloutEvent


def test_a_rollout_past_its_deadline_is_killed_with_everything_it_started(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """OpenClaw needs several seconds to start its agent: a 2 s deadline always cuts it off."""
    policy = ScriptedPolicy(tiny_model_dir, Script("write", {"path": "x", "content": "y"}))
    with serving(policy) as url:
        config = proxy_config(url, tmp_path)
        with running_proxy(config) as proxy:
            result = run_rollout(
                OpenClaw(),
                "task",
                proxy.url,
                tmp_path / "r",
                timeout_s=2,
                admin_token=proxy.config.admin_token,
            )
            proxy.flush()
    assert result.phase is RolloutPhase.TIMED_OUT and result.exit_code is None
    assert 2 <= result.duration_s < 30
    assert result.leftovers() == []
    ends = [r for r in read_events(config.log_url) if isinstance(r, RolloutEvent)]
    assert [e.phase for e in ends] == [RolloutPhase.STARTED, RolloutPhase.TIMED_OUT]
    assert ends[-1].message == "killed after 2s" and ends[-1].backend == "local"


def test_rollout_run_command(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``openforge rollout run codex TASK --proxy URL`` runs it and prints the outcome."""
    from typer.testing import CliRunner

    from openforge.cli import app

    policy = ScriptedPolicy(tiny_model_dir, Script("exec_command", {"cmd": "echo hi > hi.txt"}))
    with serving(policy) as url, running_proxy(proxy_config(url, tmp_path)) as proxy:
        out = CliRunner().invoke(
            app,
            ["rollout", "run", "codex", "say hi", "--proxy", proxy.url, "--dir", str(tmp_path)],
            env={"OPENFORGE_ADMIN_TOKEN": proxy.config.admin_token or ""},
        )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["phase"] == "finished" and summary["harness"] == "codex"
    assert summary["final_message"] == "Done: the file is written."
    assert (Path(summary["workspace"]) / "hi.txt").read_text() == "hi\n"
