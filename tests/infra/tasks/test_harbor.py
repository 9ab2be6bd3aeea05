"""Harbor's schema 1.4 keys, read from real task directories: where the verifier runs,
artifacts, steps, and what is refused (never ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.tasks import harbor, load_task
from schemas.errors import TaskError


def _task(
    root: Path, toml: str, steps: tuple[str, ...] = (), tests_dockerfile: bool = False
) -> Path:
    root.mkdir(parents=True)
    (root / "task.toml").write_text('schema_version = "1.4"\n' + toml)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if tests_dockerfile:
        (root / "tests" / "Dockerfile").write_text("FROM debian:bookworm\nCOPY . /tests/\n")
    if not steps:
        (root / "instruction.md").write_text("do it\n")
    for name in steps:
        step = root / "steps" / name
        (step / "tests").mkdir(parents=True)
        (step / "instruction.md").write_text(f"do {name}\n")
        (step / "solution").mkdir()
        (step / "solution" / "solve.sh").write_text("true\n")
    return root


def test_where_the_verifier_runs(tmp_path: Path) -> None:
    shared = load_task(_task(tmp_path / "a", ""))
    assert harbor.verifier_plan(shared) == harbor.VerifierPlan(harbor.VerifierMode.SHARED)
    assert shared.version == "1.4"
    init = load_task(
        _task(tmp_path / "b", '[verifier]\nenvironment_mode = "separate"\n', tests_dockerfile=True)
    )
    plan = harbor.verifier_plan(init)
    assert (
        plan.mode is harbor.VerifierMode.SEPARATE
        and plan.dockerfile == init.tests_dir / "Dockerfile"
    )
    image = load_task(_task(tmp_path / "c", '[verifier.environment]\ndocker_image = "debian:12"\n'))
    assert harbor.verifier_plan(image) == harbor.VerifierPlan(
        harbor.VerifierMode.SEPARATE, docker_image="debian:12"
    )
    clash = load_task(
        _task(
            tmp_path / "d",
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
        )
    )
    with pytest.raises(TaskError, match="conflicts"):
        harbor.check(clash)


def test_artifacts_map_as_harbor_maps_them(tmp_path: Path) -> None:
    toml = (
        'artifacts = ["/app/out.txt", '
        '{source = "/var/log/app", destination = "logs", exclude = ["*.tmp"]}]\n'
    )
    task = load_task(_task(tmp_path / "a", toml))
    assert harbor.artifacts(task) == (
        harbor.Artifact("/app/out.txt", "app/out.txt"),
        harbor.Artifact("/var/log/app", "logs", ("*.tmp",)),
    )
    bad = load_task(_task(tmp_path / "b", 'artifacts = ["relative/path"]\n'))
    with pytest.raises(TaskError, match="must be an absolute path"):
        harbor.check(bad)


def test_steps_load_with_their_own_prompts(tmp_path: Path) -> None:
    toml = (
        'multi_step_reward_strategy = "final"\n'
        '[[steps]]\nname = "one"\nmin_reward = 0.5\n[steps.agent]\ntimeout_sec = 30\n'
        '[[steps]]\nname = "two"\n'
    )
    task = load_task(_task(tmp_path / "a", toml, steps=("one", "two")))
    one, two = harbor.steps(task)
    assert (one.name, one.instruction, one.agent_timeout_sec, one.min_reward) == (
        "one",
        "do one\n",
        30.0,
        0.5,
    )
    assert two.instruction == "do two\n" and task.instruction == "do one\n"
    assert harbor.reward_strategy(task) is harbor.RewardStrategy.FINAL
    assert harbor.has_solution(task)
    with pytest.raises(TaskError, match="each step needs its prompt"):
        load_task(_task(tmp_path / "b", '[[steps]]\nname = "missing"\n'))


def test_an_agent_timeout_multiplier_scales_the_task_and_each_step_not_the_verifier(
    tmp_path: Path,
) -> None:
    toml = (
        "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 40\n"
        '[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 30\n'
        '[[steps]]\nname = "two"\n'
    )
    task = load_task(_task(tmp_path / "a", toml, steps=("one", "two")))
    slower = task.with_agent_timeout_multiplier(2.5).with_agent_timeout_multiplier(2)
    assert (slower.agent.timeout_sec, slower.verifier.timeout_sec) == (500.0, 40.0)
    one, two = harbor.steps(slower)
    assert (one.agent_timeout_sec, two.agent_timeout_sec) == (150.0, 500.0)
    assert (one.verifier_timeout_sec, two.verifier_timeout_sec) == (40.0, 40.0)
    assert [s.agent_timeout_sec for s in harbor.steps(task)] == [30.0, 100.0]
    with pytest.raises(TaskError, match="must be above 0, not 0"):
        task.with_agent_timeout_multiplier(0)
    # The longest a rollout may take once started: the build, then each step's agent and
    # verifier (the pipeline waits that long for its reward).
    assert harbor.rollout_deadline_s(slower) == 600 + (150 + 40) + (500 + 40)
    single = load_task(_task(tmp_path / "b", toml.split("[[steps]]")[0]))
    assert harbor.rollout_deadline_s(single) == 600 + 100 + 40


def test_what_is_not_supported_is_refused_by_name(tmp_path: Path) -> None:
    toml = (
        '[environment]\ngpus = 1\nnetwork_mode = "allowlist"\nallowed_hosts = ["x.org"]\n'
        '[[environment.mcp_servers]]\nname = "fs"\ncommand = "mcp-fs"\n'
        '[[verifier.collect]]\ncommand = "true"\nservice = "db"\n'
    )
    task = load_task(_task(tmp_path / "a", toml))
    with pytest.raises(TaskError) as refused:
        harbor.check(task)
    text = str(refused.value)
    for what in ("mcp_servers", "gpus = 1", "allowlist", "verifier.collect"):
        assert what in text
    public = load_task(_task(tmp_path / "b", '[environment]\nnetwork_mode = "public"\n'))
    assert not harbor.network_public(public)  # Harbor's default, written out: said, not a need
    assert "network_mode = 'public' (Harbor's default)" in (harbor.network_note(public) or "")
