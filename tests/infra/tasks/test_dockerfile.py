"""The Dockerfile subset the local backend honours, and the refusals (with their line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.tasks.dockerfile import Copy, parse
from schemas.errors import TaskError


def _parse(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return parse(path)


def test_the_published_shape(tmp_path: Path) -> None:
    plan = _parse(
        tmp_path,
        "# a comment\nFROM python:3.12-slim\n\nRUN pip install --no-cache-dir \\\n"
        "    pytest==8.4.1 pytest-json-ctrf==0.3.5\nWORKDIR /app\n"
        "COPY data/x.log /app/x.log\nCOPY src/ ./src/\nENV MODE=fast LEVEL=2\nENV OLD legacy form\n"
        'CMD ["bash"]\nEXPOSE 8000\n',
    )
    assert plan.base == "python:3.12-slim" and plan.workdir == "/app"
    assert plan.requirements == ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
    assert plan.copies == (
        Copy(("data/x.log",), "/app/x.log", 7),
        Copy(("src/",), "/app/src/", 8),
    )
    assert plan.env == {"MODE": "fast", "LEVEL": "2", "OLD": "legacy form"}
    assert plan.noted == ('CMD ["bash"]', "EXPOSE 8000")


def test_relative_workdirs_and_pip_spellings(tmp_path: Path) -> None:
    plan = _parse(
        tmp_path,
        "FROM x\nWORKDIR /srv\nWORKDIR app\nRUN pip3 install -q requests\n"
        "RUN python3 -m pip install --upgrade numpy==2.0\nCOPY . .\n",
    )
    assert plan.workdir == "/srv/app"
    assert plan.requirements == ("requests", "numpy==2.0")
    assert plan.copies == (Copy((".",), "/srv/app/", 6),)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("RUN apt-get install -y jq", "RUN of anything but"),
        ("RUN pip install -r requirements.txt", "RUN of anything but"),
        ("RUN pip install x && rm -rf /tmp", "RUN of anything but"),
        ("USER nobody", "USER is outside"),
        ("ARG VERSION=1", "ARG is outside"),
        ("FROM other AS second", "multi-stage"),
        ("COPY --from=build /out /app", "COPY with --from=build"),
        ("ADD https://example.com/x.tgz /app/", "ADD of a URL"),
        ("COPY ../secret /app/", "outside the build context"),
    ],
)
def test_anything_else_is_refused_naming_the_line(tmp_path: Path, line: str, why: str) -> None:
    with pytest.raises(TaskError) as refused:
        _parse(tmp_path, f"FROM python:3.12-slim\nWORKDIR /app\n{line}\n")
    message = str(refused.value)
    assert f"Dockerfile:3: `{line}`" in message and why in message
    assert "--backend kubernetes" in message


SUPPORTED = st.sampled_from(
    [
        "WORKDIR /app",
        "COPY data.txt /app/data.txt",
        "ENV A=1",
        "RUN pip install pytest==8.4.1",
        "LABEL a=b",
        "EXPOSE 80",
    ]
)
UNSUPPORTED = st.sampled_from(
    ["RUN apt-get update", "USER app", "VOLUME /data", "ONBUILD RUN x", "RUN make", 'SHELL ["sh"]']
)


@settings(max_examples=60, deadline=None)
@given(
    before=st.lists(SUPPORTED, max_size=6), bad=UNSUPPORTED, after=st.lists(SUPPORTED, max_size=3)
)
def test_the_first_unsupported_line_is_the_one_named(
    tmp_path_factory: pytest.TempPathFactory, before: list[str], bad: str, after: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("dockerfile")
    lines = ["FROM python:3.12-slim", *before, bad, *after]
    with pytest.raises(TaskError) as refused:
        _parse(tmp, "\n".join(lines) + "\n")
    assert f"Dockerfile:{len(before) + 2}: `{bad}`" in str(refused.value)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(SUPPORTED, max_size=8))
def test_supported_lines_always_parse(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("dockerfile")
    plan = _parse(tmp, "\n".join(["FROM python:3.12-slim", *lines]) + "\n")
    assert len(plan.requirements) == lines.count("RUN pip install pytest==8.4.1")
    assert len(plan.copies) == lines.count("COPY data.txt /app/data.txt")
