"""Harbor's current task schema (1.4), on tasks that ``harbor init`` wrote (harbor 0.25.0:
``harbor init -t openforge/hello-init`` and ``--steps 2``, then a one-line instruction, solution
and test filled in; ``harbor lint`` passes both), through the real local backend: the separate
verifier image built from ``tests/Dockerfile`` (uv copied from its image, made here from uv's
wheel; pytest installed with ``uv pip``), artifacts, and a multi-step task's per-step rewards."""

from __future__ import annotations

from pathlib import Path

from infra.harnesses import NoOp, Oracle
from infra.tasks import harbor, load_task
from orchestrator.rundir import Status
from tests.orchestrator.conftest import job

DATA = Path(__file__).with_name("data")


def test_the_harbor_init_template_scores_1_with_its_oracle_and_0_doing_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(DATA / "harbor-init")
    assert harbor.verifier_plan(task).mode is harbor.VerifierMode.SEPARATE
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as j:
        notes = j.orchestrator.check([task])
        (solved,) = j.run([task])
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as j2:
        (nothing,) = j2.run([task])
    said = "\n".join(notes)
    assert "ubuntu:24.04 -> debian:bookworm (stand-in)" in said
    assert "verifier separate: image localhost/openforge/task:" in said
    assert "ghcr.io/astral-sh/uv:0.9.7 (made from its wheel)" in said
    assert "network_mode = 'public' (Harbor's default)" in said
    assert (solved.status, solved.reward) == (Status.VERIFIED, 1.0), solved
    assert (nothing.status, nothing.reward) == (Status.VERIFIED, 0.0), nothing
    root = j.out / "rollouts" / solved.rollout_id
    assert "1 passed" in (root / "verifier.out").read_text()  # pytest from the verifier image
    assert (root / "artifacts" / "logs" / "artifacts" / "hello.txt").read_text() == "hello\n"


def test_a_multi_step_task_is_played_step_by_step_with_a_reward_per_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(DATA / "harbor-steps")
    assert [s.name for s in harbor.steps(task)] == ["step-1", "step-2"]
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as j:
        (solved,) = j.run([task])
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as j2:
        (nothing,) = j2.run([task])
    assert (solved.status, solved.reward) == (Status.VERIFIED, 1.0), solved
    assert (nothing.status, nothing.reward) == (Status.VERIFIED, 0.0), nothing
    root = j.out / "rollouts" / solved.rollout_id
    for step in ("step-1", "step-2"):
        assert (root / f"agent-{step}.out").exists()
        assert "1 passed" in (root / f"verifier-{step}.out").read_text()
    # The second step's verifier saw both steps' lines: one environment, played in order.
    assert (root / "workspace" / "words.txt").read_text().split() == ["one", "two"]
    assert (root / "artifacts" / "app" / "words.txt").read_text().split() == ["one", "two"]
    result = (root / "result.json").read_text()
    assert '"step-1.reward": 1.0' in result and '"step-2.reward": 1.0' in result
