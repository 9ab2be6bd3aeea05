"""Orchestration: groups, retries of infrastructure failures (counted, dead-lettered), and
cancellation that leaves nothing running. Real sandboxes, real proxy, real event log."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from infra.harnesses import Agent, NoOp
from infra.harnesses.base import Endpoint, Invocation, RolloutDirs
from infra.local.process import processes_of
from infra.sandbox.bwrap import bwrap_binary
from infra.tasks import harbor, load_dataset, load_task
from openforge.testing.proxy import read_events
from orchestrator.local import LocalConfig
from orchestrator.plan import plan
from orchestrator.rundir import Status
from pipeline.jobs import Outputs, run_streaming
from schemas.archive import read_archive
from schemas.enums import RolloutPhase
from schemas.episode import SUPERSEDED, Episode, superseded
from schemas.errors import ConfigError, SetupError
from schemas.rollout import DEADLINE_S, RETRIED, RolloutEvent
from tests.orchestrator.conftest import EXAMPLES, job


def _task(root: Path, verifier: str, agent_timeout: float = 60) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "instruction.md").write_text("Do it.\n")
    (root / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = {agent_timeout}\n[verifier]\ntimeout_sec = 30\n'
        '[environment]\nworkdir = "/app"\n'
    )
    (root / "tests" / "test.sh").write_text(verifier)
    return root


def test_plan_makes_one_group_per_task() -> None:
    tasks = load_dataset(EXAMPLES)
    planned = plan(tasks, 3, run_id="run 1")
    assert len(planned) == 3 * len(tasks)
    by_group: dict[str, list[int]] = {}
    for p in planned:
        by_group.setdefault(p.group_id, []).append(p.sample)
    assert sorted(by_group) == sorted(f"run-1-{t.id}" for t in tasks)
    assert all(samples == [0, 1, 2] for samples in by_group.values())
    assert planned[0].rollout_id(1) == f"run-1-{tasks[0].id}-0"
    assert planned[0].rollout_id(2) == f"run-1-{tasks[0].id}-0-a2"
    with pytest.raises(ConfigError, match="at least 1"):
        plan(tasks, 0, run_id="r")


def test_an_infrastructure_failure_is_retried_counted_and_dead_lettered(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = load_task(_task(tmp_path / "broken", "#!/bin/bash\necho 'no reward written'\n"))
    with job(tmp_path / "job", NoOp(), tiny_model_dir, max_attempts=2) as j:
        (record,) = j.run([broken])
        j.proxy.flush()
        log_url = j.proxy.config.log_url
        counts = j.orchestrator.counts
    assert record.status is Status.INFRA_FAILED and record.attempt == 2
    assert "gave no reward" in record.message
    assert (counts.infra_failures, counts.gave_up, counts.done) == (2, 1, 0)
    first, second = record.rollout_id.removesuffix("-a2"), record.rollout_id
    events = [r for r in read_events(log_url, want=8) if isinstance(r, RolloutEvent)]
    for rollout_id in (first, second):
        phases = [e.phase for e in events if e.rollout_id == rollout_id]
        assert phases == [
            RolloutPhase.QUEUED,
            RolloutPhase.STARTED,
            RolloutPhase.FINISHED,
            RolloutPhase.INFRA_FAILED,
        ]
    # Each attempt's start says how long the task allows it: the pipeline waits that long.
    started = [e for e in events if e.phase is RolloutPhase.STARTED]
    budget = harbor.rollout_deadline_s(broken)
    assert budget == 600 + broken.agent.timeout_sec + broken.verifier.timeout_sec
    assert [e.metadata.get(DEADLINE_S) for e in started] == [f"{budget:g}"] * 2
    # The first attempt says a new attempt plays its sample again; the last one does not.
    failed = {e.rollout_id: e for e in events if e.phase is RolloutPhase.INFRA_FAILED}
    assert failed[first].metadata.get(RETRIED) == "true"
    assert RETRIED not in failed[second].metadata
    run_streaming(
        log_url, Outputs(None, str(tmp_path / "ep")), allowed_lateness_s=5, stop_when_idle_s=3
    )
    dead = {d.rollout_id: d for d in read_archive(tmp_path / "ep" / "deadletter", Episode)}
    assert set(dead) == {first, second}
    # The retried attempt is superseded (its retry is the group's member), the last one lost.
    assert superseded(dead[first]) and not superseded(dead[second])
    assert (dead[first].dead_letter or "").startswith(f"{SUPERSEDED}: ")
    assert (dead[second].dead_letter or "").startswith("infrastructure failure: ")


def test_a_missing_sandbox_tool_fails_the_run_once_before_any_rollout(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(_task(tmp_path / "t", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"))
    missing = tmp_path / "no-such-bwrap"
    local = LocalConfig(bwrap=missing)
    with job(tmp_path / "job", NoOp(), tiny_model_dir, max_attempts=3, local=local) as j:
        with pytest.raises(SetupError, match=f"bubblewrap not found at {missing}.*scripts/setup"):
            j.run([task], n=4)
        counts = j.orchestrator.counts
        assert read_events(j.proxy.config.log_url, want=1, timeout=2) == []  # nothing queued
    assert (counts.planned, counts.infra_failures, counts.gave_up) == (0, 0, 0)
    assert list((j.out / "rollouts").iterdir()) == []


def test_a_set_up_error_met_mid_run_stops_the_run_without_retries(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(_task(tmp_path / "t", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"))
    bwrap = tmp_path / "bwrap"
    bwrap.symlink_to(bwrap_binary())
    local = LocalConfig(bwrap=bwrap)
    with job(
        tmp_path / "job", NoOp(), tiny_model_dir, concurrency=1, max_attempts=3, local=local
    ) as j:
        j.orchestrator.check([task])  # bubblewrap is there: the preflight passes
        bwrap.unlink()  # ... and then it is gone
        with pytest.raises(SetupError, match="bubblewrap not found"):
            j.run([task], n=2)
        j.proxy.flush()
        events = [e for e in read_events(j.proxy.config.log_url) if isinstance(e, RolloutEvent)]
        counts = j.orchestrator.counts
    first, second = (p.rollout_id(1) for p in plan([task], 2, run_id=j.out.name))
    assert (counts.infra_failures, counts.gave_up, counts.cancelled) == (0, 0, 1)
    assert [p.name for p in (j.out / "rollouts").iterdir()] == [first]  # one attempt, no -a2
    summary = {r["rollout_id"]: r for r in json.loads((j.out / "summary.json").read_text())}
    assert summary[first]["status"] == "infra_failed" and summary[first]["attempt"] == 1
    assert "bubblewrap not found" in summary[first]["message"]
    assert summary[second]["status"] == "cancelled"
    assert [e.phase for e in events if e.rollout_id == first][-1] is RolloutPhase.INFRA_FAILED
    assert [e.phase for e in events if e.rollout_id == second] == [RolloutPhase.QUEUED]


def test_a_context_shorter_than_the_harness_prompt_stops_the_run_once_with_the_fix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The agent's first prompt (its system prompt and tool, ~560 tokens) does not fit a
    256-token context: the proxy refuses the call in the harness's dialect, and the run stops
    at that rollout with the fix, instead of scoring every rollout 0 (issue 49, bad input)."""
    task = load_task(_task(tmp_path / "t", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"))
    with job(tmp_path / "job", Agent(), tiny_model_dir, concurrency=1, max_model_len=256) as j:
        with pytest.raises(ConfigError, match=r"agent harness sent a \d+-token prompt") as err:
            j.run([task], n=3)
        counts = j.orchestrator.counts
    assert "context is 256 tokens" in str(err.value) and "model.context=4096" in str(err.value)
    assert (counts.infra_failures, counts.gave_up, counts.done) == (0, 0, 0)
    summary = json.loads((j.out / "summary.json").read_text())
    assert [r["status"] for r in summary] == ["infra_failed", "cancelled", "cancelled"]


class Sleeper(NoOp):
    """An agent that never finishes on its own (and starts a background process too)."""

    name = "sleeper"

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        argv = ["/bin/bash", "-c", "(sleep 1000 &) ; sleep 1000"]
        return Invocation(argv, self.base_env(dirs, endpoint), dirs.workspace)


def test_cancellation_mid_run_leaves_nothing_running(tiny_model_dir: Path, tmp_path: Path) -> None:
    slow = load_task(_task(tmp_path / "slow", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"))
    with job(tmp_path / "job", Sleeper(), tiny_model_dir, concurrency=2) as j:
        records: list[object] = []
        runner = threading.Thread(target=lambda: records.extend(j.run([slow], n=4)))
        runner.start()
        deadline = time.monotonic() + 60
        while len(processes_of(f"{os.getpid()}.sandbox.")) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)  # two sandboxes, each with its init and the agent's processes
        assert j.orchestrator.counts.running == 2
        started = time.monotonic()
        j.orchestrator.cancel()
        runner.join(60)
        assert not runner.is_alive() and time.monotonic() - started < 30
    assert processes_of(f"{os.getpid()}.sandbox.") == []  # the session's services may run
    statuses = sorted(r.status for r in records)  # type: ignore[attr-defined]
    assert statuses.count(Status.CANCELLED) >= 2 and len(statuses) == 4
    assert j.orchestrator.counts.done == 0


def test_the_local_backend_refuses_what_it_cannot_provide(tmp_path: Path) -> None:
    from infra.harnesses import Oracle
    from infra.sandbox import BubblewrapSandbox, ProxyEndpoint
    from orchestrator.backend import RolloutBackendName, RunProxy
    from orchestrator.local import LocalBackend
    from orchestrator.registry import ROLLOUT_BACKENDS, RolloutBackendConfig, build_backend

    root = _task(tmp_path / "imaged", "#!/bin/bash\n")
    toml = root / "task.toml"
    toml.write_text(toml.read_text() + 'docker_image = "ghcr.io/example/torch:2"\n')
    backend = LocalBackend(BubblewrapSandbox(), ProxyEndpoint(tmp_path / "p.sock", 8100))
    with pytest.raises(ConfigError, match=r"'ghcr\.io/example/torch:2' cannot be had here"):
        backend.check(load_task(root), NoOp())
    with pytest.raises(ConfigError, match=r"no solution/solve\.sh"):
        backend.check(load_task(_task(tmp_path / "unsolved", "#!/bin/bash\n")), Oracle())
    with pytest.raises(
        ConfigError, match="unknown rollout backend 'k8s': choose one of kubernetes, local"
    ):
        ROLLOUT_BACKENDS.get("k8s")
    with pytest.raises(ConfigError, match="unknown rollout backend 'k8s': choose one of"):
        RolloutBackendConfig(name="k8s")  # type: ignore[arg-type]
    # Every backend is registered and has its own config section, named as it is.
    assert ROLLOUT_BACKENDS.names() == sorted(RolloutBackendName)
    sections = [RolloutBackendConfig(name=n).section() for n in RolloutBackendName]
    assert len({type(s) for s in sections}) == len(RolloutBackendName)
    # Sandboxes reach the proxy through its socket only: a proxy without one is refused.
    with pytest.raises(ConfigError, match="--proxy-socket"):
        build_backend(RolloutBackendConfig(), RunProxy("http://127.0.0.1:8100"))
