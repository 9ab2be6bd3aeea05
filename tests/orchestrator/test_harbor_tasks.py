"""A typical published Harbor task runs unchanged on the local backend, without Docker: a
Dockerfile with ``FROM python:3.12-slim``, ``RUN pip install pytest pytest-json-ctrf``,
``WORKDIR /app`` and ``COPY data/access.log /app/access.log``; a pytest verifier writing a CTRF
report and ``reward.txt``; a solution that writes by absolute path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.harnesses import NoOp, Oracle
from infra.sandbox import BubblewrapSandbox, ProxyEndpoint
from infra.tasks import load_task
from infra.tasks.pip_env import ensure_pip_env
from openforge.testing.proxy import read_events
from orchestrator.environments import SandboxMode
from orchestrator.local import LocalBackend, LocalConfig
from orchestrator.rundir import Status
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError, TaskError
from schemas.rollout import COSTS, RolloutEvent
from tests.orchestrator.conftest import job

DATA = Path(__file__).with_name("data")
REQUIREMENTS = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")


BUBBLEWRAP = LocalConfig(sandbox=SandboxMode.BUBBLEWRAP)


def test_a_typical_harbor_task_in_a_container_of_its_image(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(DATA / "count-errors")  # RUN pip install pytest ... in its Dockerfile
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as j:
        notes = j.orchestrator.check([task])
        (solved,) = j.run([task])
        j.proxy.flush()
        events = read_events(j.proxy.config.log_url, want=4)
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as j2:
        (nothing,) = j2.run([task])
    assert any("FROM python:3.12-slim -> python:3.11-slim (stand-in)" in n for n in notes)
    _check_costs(events, solved.rollout_id)
    assert (solved.status, solved.reward) == (Status.VERIFIED, 1.0), solved
    assert (nothing.status, nothing.reward) == (Status.VERIFIED, 0.0), nothing
    root = j.out / "rollouts" / solved.rollout_id
    assert (root / "workspace" / "access.log").exists()  # the image's WORKDIR, as COPY left it
    assert "2 passed" in (root / "verifier.out").read_text()  # the image's own pytest


def test_a_typical_harbor_task_on_the_bubblewrap_fast_path(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path / "cache"))  # a cold pip environment
    task = load_task(DATA / "count-errors")
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir, local=BUBBLEWRAP) as j:
        notes = j.orchestrator.check([task])
        (solved,) = j.run([task])
    with job(tmp_path / "noop", NoOp(), tiny_model_dir, local=BUBBLEWRAP) as j2:
        (nothing,) = j2.run([task])
    assert any("FROM python:3.12-slim" in n and "root filesystem" in n for n in notes)
    assert any("pytest==8.4.1 pytest-json-ctrf==0.3.5" in n for n in notes)
    assert (solved.status, solved.reward) == (Status.VERIFIED, 1.0), solved
    assert (nothing.status, nothing.reward) == (Status.VERIFIED, 0.0), nothing
    root = j.out / "rollouts" / solved.rollout_id
    assert (root / "workspace" / "access.log").exists()  # COPY laid it into /app
    assert (root / "workspace" / "errors.txt").read_text().strip() == "3"
    assert '"passed": 2' in (root / "logs" / "verifier" / "ctrf.json").read_text()
    assert "2 passed" in (root / "verifier.out").read_text()
    # The pip environment was built once, for both jobs: a third use installs nothing.
    again = ensure_pip_env(REQUIREMENTS)
    assert not again.built and (again.bin_dir / "pytest").exists()
    assert again.root.parent == tmp_path / "cache" / "task-envs"
    assert len(list((tmp_path / "cache" / "task-envs").glob("*/.complete"))) == 1


def _check_costs(events: list[object], rollout_id: str) -> None:
    """The verified event carries every cost a local run measures, each consistent."""
    (verified,) = [
        e
        for e in events
        if isinstance(e, RolloutEvent)
        and e.rollout_id == rollout_id
        and e.phase is RolloutPhase.VERIFIED
    ]
    costs = verified.costs
    # A container run: its cgroup measures CPU and memory. The oracle calls no model, so it has
    # no time to its first call (ready_s).
    assert set(costs) == set(COSTS) - {"ready_s"}, costs
    assert costs["agent_s"] + costs["verifier_s"] + costs["prepare_s"] <= costs["wall_s"]
    assert 0 < costs["agent_cpu_s"] <= costs["agent_s"] * 2  # 2 cores at most
    assert costs["agent_peak_mib"] > 1 and costs["verifier_peak_mib"] > 1
    assert costs["verifier_cpu_s"] > 0.05  # pytest in the verifier's container


def _copy_with(tmp: Path, dockerfile_extra: str = "", toml_extra: str = "") -> Path:
    task = tmp / "task"
    shutil.copytree(DATA / "count-errors", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + dockerfile_extra)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("allow_internet = false\n", toml_extra))
    return task


def test_an_unsupported_instruction_is_refused_naming_its_line(tmp_path: Path) -> None:
    task = load_task(_copy_with(tmp_path, "RUN apt-get update && apt-get install -y jq\n"))
    backend = LocalBackend(
        BubblewrapSandbox(),
        ProxyEndpoint(tmp_path / "p.sock", 8100),
        sandbox_mode=SandboxMode.BUBBLEWRAP,
    )
    with pytest.raises(TaskError) as refused:
        backend.check(task, Oracle())
    message = str(refused.value)
    assert "Dockerfile:8: `RUN apt-get update && apt-get install -y jq`" in message
    assert "--backend kubernetes" in message and "docker_image" in message


def test_allow_internet_is_refused_unless_opted_in(tmp_path: Path) -> None:
    task = load_task(_copy_with(tmp_path, toml_extra="allow_internet = true\n"))
    endpoint = ProxyEndpoint(tmp_path / "p.sock", 8100)
    with pytest.raises(ConfigError, match="reaches only the proxy"):
        LocalBackend(BubblewrapSandbox(), endpoint).check(task, Oracle())
    opted_in = LocalBackend(
        BubblewrapSandbox(), endpoint, allow_internet_tasks=True, sandbox_mode=SandboxMode.AUTO
    )
    notes = opted_in.check(task, Oracle())
    assert any("without internet" in n for n in notes)


def test_tasks_check_reports_each_task_and_runs_the_oracle(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shutil.copytree(DATA / "count-errors", tasks / "count-errors")
    shutil.copytree(_copy_with(tmp_path / "a", "USER ghost\n"), tasks / "needs-user")
    (tasks / "broken").mkdir()
    (tasks / "broken" / "task.toml").write_text('version = "1.0"\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "openforge",
            "tasks",
            "check",
            str(tasks),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "300"},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1, done.stdout + done.stderr  # two tasks cannot run here
    lines = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if "│" in line}
    assert "container" in lines["count-errors"] and "1.000" in lines["count-errors"]
    assert "refused" in lines["needs-user"] and "USER 'ghost' does not exist" in lines["needs-user"]
    assert "refused" in lines["broken"] and "instruction.md" in lines["broken"]
    assert "3 tasks: 1 runnable here, 2 refused" in done.stdout
