"""Tasks that need their own image (examples/images), through the real local backend: each is
built with buildah and runs in runc containers of its image; the oracle scores 1 and noop 0."""

from __future__ import annotations

from pathlib import Path

from infra.harnesses import NoOp, Oracle
from infra.tasks import load_dataset
from orchestrator.rundir import Status
from tests.orchestrator.conftest import ROOT, job

IMAGES = ROOT / "examples" / "images"


def test_oracle_1_and_noop_0_in_containers_of_each_tasks_image(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tasks = load_dataset(IMAGES)
    assert sorted(t.id for t in tasks) == [
        "notes-service",
        "package-count",
        "run-as-user",
        "sqlite-report",
    ]
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as oracle:
        notes = oracle.orchestrator.check(tasks)
        solved = oracle.run(tasks)
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as noop:
        nothing = noop.run(tasks)
    assert {(r.task_id, r.status, r.reward) for r in solved} == {
        (t.id, Status.VERIFIED, 1.0) for t in tasks
    }
    assert {(r.task_id, r.status, r.reward) for r in nothing} == {
        (t.id, Status.VERIFIED, 0.0) for t in tasks
    }
    said = "\n".join(notes)
    assert "run-as-user: image localhost/openforge/task:" in said and "user worker" in said
    assert "python:3.12-slim -> python:3.11-slim (stand-in)" in said
    assert "debian:bookworm-slim (exact)" in said
    # The verifier saw the image's own files, not this machine's: its package count is the slim
    # image's (this machine has hundreds more packages).
    (pc,) = [r for r in solved if r.task_id == "package-count"]
    out = (oracle.out / "rollouts" / pc.rollout_id / "verifier.out").read_text()
    count = int(out.split("expected ")[1].split()[0])
    host = len(Path("/var/lib/dpkg/status").read_text().split("\nPackage: "))
    assert 50 < count < host - 100
