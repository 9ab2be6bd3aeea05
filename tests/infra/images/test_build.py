"""Task images built with real buildah from the local base catalogue: the build, the cache, and
each way a task's image cannot be had, named with its task and line."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from infra.images import ImageBuilder, ImagePolicy
from infra.tasks import load_task
from schemas.errors import TaskError


def _task(tmp_path: Path, dockerfile: str, name: str = "t") -> Path:
    root = tmp_path / name
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "instruction.md").write_text("do it\n")
    (root / "task.toml").write_text('version = "1.0"\n')
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    (root / "environment" / "data.txt").write_text("one\n")
    (root / "environment" / "nonce.txt").write_text(uuid.uuid4().hex)  # a build of its own
    return root


def test_a_build_its_config_and_a_cache_hit(tmp_path: Path) -> None:
    root = _task(
        tmp_path,
        "FROM python:3.12-slim\nARG WHO=worker\nRUN useradd -m $WHO\nWORKDIR /work\n"
        "COPY data.txt .\nENV GREETING=hi\nUSER worker\n",
    )
    builder = ImageBuilder()
    lines: list[str] = []
    first = builder.image(load_task(root), say=lines.append)
    assert not first.cached and lines == [f"t: building {first.ref}"]
    assert first.config.workdir == "/work" and first.config.env["GREETING"] == "hi"
    assert first.user.name == "worker" and first.user.uid >= 1000
    assert (first.rootfs / "work" / "data.txt").read_text() == "one\n"
    assert [b.describe() for b in first.bases] == [
        "python:3.12-slim -> python:3.11-slim (stand-in)"
    ]
    again = builder.image(load_task(root), say=lines.append)
    assert again.cached and again.ref == first.ref and len(lines) == 1  # no second build
    (root / "environment" / "data.txt").write_text("two\n")  # a changed file builds again
    changed = builder.image(load_task(root))
    assert not changed.cached and changed.ref != first.ref
    assert (changed.rootfs / "work" / "data.txt").read_text() == "two\n"


def test_a_failed_build_names_the_task_and_the_line(tmp_path: Path) -> None:
    root = _task(tmp_path, "FROM debian:bookworm-slim\nWORKDIR /app\nRUN exit 3\nRUN true\n")
    with pytest.raises(TaskError) as caught:
        ImageBuilder().image(load_task(root))
    text = str(caught.value)
    assert "task t: its image did not build" in text and "Dockerfile:3: RUN exit 3" in text
    assert "full log:" in text


def test_a_missing_user_a_strict_base_and_an_unknown_image(tmp_path: Path) -> None:
    nobody = _task(tmp_path, "FROM debian:bookworm-slim\nUSER ghost\n", "nobody")
    with pytest.raises(TaskError, match="USER 'ghost' does not exist in the image"):
        ImageBuilder().image(load_task(nobody))
    strict = _task(tmp_path, "FROM python:3.12-slim\n", "strict")
    with pytest.raises(TaskError, match="strict-images is on"):
        ImageBuilder(policy=ImagePolicy(strict=True)).image(load_task(strict))
    unknown = _task(tmp_path, "FROM quay.io/nobody/nothing:1\n", "unknown")
    with pytest.raises(TaskError, match="cannot be had here"):
        ImageBuilder().image(load_task(unknown))
    shutil.rmtree(tmp_path)
