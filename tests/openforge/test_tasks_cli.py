"""``openforge tasks build`` and a run with a task whose image cannot be built, as a user types
them from the repository root: real buildah, real containers, relative paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _openforge(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openforge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_tasks_build_builds_each_image_once() -> None:
    first = _openforge("tasks", "build", "examples/images")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "3 tasks: 3 ready, 0 refused" in first.stdout
    again = _openforge("tasks", "build", "examples/images")
    assert again.returncode == 0 and again.stdout.count("(cached)") == 3, again.stdout
    assert "building" not in again.stdout
    assert "run-as-user: image localhost/openforge/task:" in again.stdout
    assert "user worker" in again.stdout


def test_a_task_whose_image_does_not_build_is_refused_and_the_others_run(tmp_path: Path) -> None:
    tasks = ROOT / "runs" / f"test-refused-{os.getpid()}"
    try:
        shutil.copytree(ROOT / "examples" / "tasks" / "write-file", tasks / "good")
        shutil.copytree(ROOT / "examples" / "tasks" / "write-file", tasks / "bad")
        dockerfile = tasks / "bad" / "environment" / "Dockerfile"
        dockerfile.write_text("FROM debian:bookworm-slim\nWORKDIR /app\nRUN exit 3\n")
        rel = tasks.relative_to(ROOT)
        done = _openforge(
            "rollouts", "run", "--tasks", str(rel), "--harness", "oracle", "--out", str(rel / "out")
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "refused bad: task bad: its image did not build" in done.stdout
        assert "Dockerfile:3: RUN exit 3" in done.stdout
        assert "1 verified" in done.stdout and "mean reward 1.000" in done.stdout
        assert "1 tasks refused: bad" in done.stdout
        build = _openforge("tasks", "build", str(rel))
        assert build.returncode == 1 and "2 tasks: 1 ready, 1 refused" in build.stdout
    finally:
        shutil.rmtree(tasks, ignore_errors=True)
