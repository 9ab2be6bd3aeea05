"""The oracle harness runs each example task's solution through the local rollout runner.

No sandbox yet: the task's environment files are laid into the rollout's workspace by hand, and
the solution is run from the task's own directory (a sandbox mounts it at ``/solution``). The
verifiers use the sandbox's absolute paths and are not run here, except the csv-summary checker,
which takes its paths as arguments.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infra.harnesses import Oracle
from infra.harnesses.runner import run_rollout
from infra.tasks import Task, load_dataset, read_reward
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from schemas.enums import RolloutPhase
from schemas.rollout import RolloutEvent

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"


def lay_workspace(task: Task, workspace: Path) -> None:
    """What a sandbox does before the harness starts: the environment's files in the workdir."""
    assert task.environment_dir is not None
    shutil.copytree(task.environment_dir, workspace, ignore=shutil.ignore_patterns("Dockerfile"))


def check_outcome(task: Task, workspace: Path, tmp_path: Path) -> None:
    if task.id == "write-file":
        assert (workspace / "hello.txt").read_text() == "hello from openforge\n"
    elif task.id == "fix-failing-test":
        tests = subprocess.run(["python3", "-m", "unittest"], cwd=workspace, capture_output=True)
        assert tests.returncode == 0, tests.stderr
    elif task.id == "csv-summary":
        checker = task.tests_dir / "check_summary.py"
        for summary, want in ((workspace / "summary.json", 1.0), (tmp_path / "none.json", 0.0)):
            out = tmp_path / f"verifier-{want}"
            out.mkdir()
            args = [summary, task.tests_dir / "sales.csv", out / "reward.json"]
            subprocess.run(["python3", checker, *args], check=True, capture_output=True)
            assert read_reward(out).reward == want
    else:
        pytest.fail(f"no check for example task {task.id}")


@pytest.mark.parametrize("task", load_dataset(EXAMPLES / "manifest.toml"), ids=lambda t: t.id)
def test_the_oracle_solves_each_example(task: Task, tiny_model_dir: Path, tmp_path: Path) -> None:
    # The oracle calls no model: the proxy only registers the rollout and records its end.
    config = proxy_config(
        "http://127.0.0.1:9",
        tmp_path,
        upstream_model="tiny",
        tokenizer=tiny_model_dir,
        max_model_len=4096,
    )
    root = tmp_path / "rollouts"
    rollout_id = f"oracle-{task.id}"
    workspace = root / rollout_id / "workspace"
    lay_workspace(task, workspace)
    assert task.solution_dir is not None
    oracle = Oracle(task.solution_dir, task.solution_env)
    with running_proxy(config) as proxy:
        result = run_rollout(
            oracle,
            task.instruction,
            proxy.url,
            root,
            rollout_id=rollout_id,
            task_id=task.id,
            timeout_s=task.agent.timeout_sec,
            admin_token=proxy.config.admin_token,
        )
        proxy.flush()
    assert result.phase is RolloutPhase.FINISHED, (result.stdout, result.stderr)
    assert result.exit_code == 0 and result.leftovers() == []
    assert result.dirs.workspace == workspace and result.report.final_message
    check_outcome(task, workspace, tmp_path)
    ends = [r for r in read_events(config.log_url) if isinstance(r, RolloutEvent)]
    assert [(e.phase, e.harness, e.harness_version) for e in ends] == [
        (RolloutPhase.STARTED, "oracle", "1"),
        (RolloutPhase.FINISHED, "oracle", "1"),
    ]
