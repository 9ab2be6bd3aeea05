"""Which local image each FROM gets: exact names, stand-ins, strict mode, stages, ARGs; the
resolved Dockerfile keeps every line where the author wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.images.resolve import ImagePolicy, normalise, resolve_dockerfile
from schemas.errors import TaskError


def _resolve(tmp_path: Path, text: str, **policy: object) -> tuple[str, list[str]]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    out, resolved = resolve_dockerfile(path, ImagePolicy(**policy), lambda ref: False)  # type: ignore[arg-type]
    return out, [r.describe() for r in resolved]


def test_exact_names_stand_ins_stages_and_args(tmp_path: Path) -> None:
    text = (
        "ARG BASE=python:3.12-slim\n"
        "FROM docker.io/library/debian:12 AS build\n"
        "RUN echo hi\n"
        "FROM ${BASE}\n"
        "COPY --from=build /x /x\n"
        "COPY --from=0 /y /y\n"
        "FROM build AS again\n"
    )
    out, said = _resolve(tmp_path, text)
    assert said == [
        "docker.io/library/debian:12 (exact)",
        "python:3.12-slim -> python:3.11-slim (stand-in)",
    ]
    lines = out.splitlines()
    assert lines[1] == "FROM localhost/debian:bookworm AS build"
    assert lines[3] == "FROM localhost/python:3.11-slim"
    assert lines[4] == "COPY --from=build /x /x" and lines[6] == "FROM build AS again"


def test_strict_refuses_a_stand_in_and_an_unknown_image_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"Dockerfile:1: the image 'python:3.12-slim'.*strict"):
        _resolve(tmp_path, "FROM python:3.12-slim\n", strict=True)
    with pytest.raises(TaskError, match=r"Dockerfile:2: .*'ghcr.io/example/tool:1.0'"):
        _resolve(tmp_path, "FROM debian:bookworm\nCOPY --from=ghcr.io/example/tool:1.0 /t /t\n")
    # An image that is only a binary is made from its wheel, strict or not: the same binary.
    uv = "FROM debian:bookworm\nCOPY --from=ghcr.io/astral-sh/uv:0.9.7 /uv /u\n"
    _, said = _resolve(tmp_path, uv, strict=True)
    assert said[1] == "ghcr.io/astral-sh/uv:0.9.7 (made from its wheel)"
    out, said = _resolve(tmp_path, "FROM alpine:3.20\n", pull=True)
    assert said == ["alpine:3.20 (pulled)"] and out == "FROM alpine:3.20\n"


def test_normalise() -> None:
    assert normalise("python") == "python:latest"
    assert normalise("docker.io/library/python:3.12") == "python:3.12"
    assert normalise("ghcr.io/org/img") == "ghcr.io/org/img:latest"


_line = st.one_of(
    st.sampled_from(["RUN echo a", "WORKDIR /app", "ENV A=1", "# comment", "", "USER worker"]),
    st.sampled_from(
        ["FROM python:3.12-slim", "FROM debian:bookworm-slim AS s", "FROM ubuntu:22.04"]
    ),
)


@given(st.lists(_line, min_size=1, max_size=30))
def test_every_line_stays_where_it_was(lines: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Dockerfile"
        path.write_text("\n".join(lines) + "\n")
        out, _ = resolve_dockerfile(path, ImagePolicy(), lambda ref: False)
    got = out.splitlines()
    assert len(got) == len(lines)
    for before, after in zip(lines, got, strict=True):
        if not before.startswith("FROM"):
            assert after == before
