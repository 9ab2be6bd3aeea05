"""Every path a user gives the CLI is made absolute at the edge (``openforge/cli/paths.py``):
declared so on every command, and working as typed, relative, from another directory."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from types import UnionType

import pytest
import typer
from typer.models import ArgumentInfo, OptionInfo

from openforge.cli import app
from openforge.cli.paths import absolute_location

ROOT = Path(__file__).resolve().parents[3]


def _callbacks(
    typer_app: typer.Typer, prefix: str = ""
) -> Iterator[tuple[str, Callable[..., object]]]:
    for command in typer_app.registered_commands:
        assert command.callback is not None
        yield f"{prefix}{command.name or command.callback.__name__}", command.callback
    for group in typer_app.registered_groups:
        assert group.typer_instance is not None
        yield from _callbacks(group.typer_instance, f"{prefix}{group.name} ")


def _is(kind: type, annotation: object) -> bool:
    if isinstance(annotation, UnionType) or typing.get_origin(annotation) is typing.Union:
        return kind in typing.get_args(annotation)
    return annotation is kind


def _parameters() -> Iterator[tuple[str, str, object, OptionInfo | ArgumentInfo]]:
    for name, callback in _callbacks(app):
        for param, hint in typing.get_type_hints(callback, include_extras=True).items():
            if typing.get_origin(hint) is typing.Annotated:
                kind, info = typing.get_args(hint)[:2]
                if isinstance(info, OptionInfo | ArgumentInfo):
                    yield name, param, kind, info


def test_every_path_option_is_made_absolute() -> None:
    paths = [(c, p, i) for c, p, kind, i in _parameters() if _is(Path, kind)]
    assert len(paths) > 30  # the walk found the commands
    relative = [f"openforge {c}: {p}" for c, p, info in paths if not info.resolve_path]
    assert not relative, "Path parameters without resolve_path=True"


def _takes_location(help_text: str) -> bool:
    return "DIR" in help_text or any(
        w in help_text.lower() for w in ("local:", "archive", "event log")
    )


def test_every_location_option_is_made_absolute() -> None:
    """A text option that takes a directory or a log URL (its help names DIR, local:, an
    archive or an event log) goes through absolute_location."""
    found = [
        (c, p, info)
        for c, p, kind, info in _parameters()
        if _is(str, kind) and _takes_location(info.help or "")
    ]
    assert len(found) >= 9
    missing = [
        f"openforge {c}: {p}" for c, p, info in found if info.parser is not absolute_location
    ]
    assert not missing, "location options without parser=absolute_location"


@pytest.mark.parametrize(
    ("given", "absolute"),
    [
        ("local:runs/x", "local:{cwd}/runs/x"),
        ("local://runs/x", "local:{cwd}/runs/x"),
        ("archive:a/../b", "archive:{cwd}/b"),
        ("local:/abs/x", "local:/abs/x"),
        ("runs/archive", "{cwd}/runs/archive"),
        ("kafka://127.0.0.1:9092", "kafka://127.0.0.1:9092"),
    ],
)
def test_absolute_location(
    given: str, absolute: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_location(given) == absolute.format(cwd=tmp_path)


def _openforge(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openforge", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_rollouts_and_tasks_check_with_relative_paths_from_another_directory(
    tmp_path: Path,
) -> None:
    """The README's first rollout command as a newcomer types it, from a directory that is not
    the repository's: every example task scores 1 with its own solution (it once failed every
    rollout: a relative run directory reached the sandbox's mount points)."""
    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks")
    done = _openforge(
        tmp_path, "rollouts", "run", "--tasks", "tasks", "--harness", "oracle", "--out", "runs/o"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "runs" / "o" / "summary.csv").open()))
    assert len(rows) == 3 and {r["reward"] for r in rows} == {"1.0"}, rows
    checked = _openforge(tmp_path, "tasks", "check", "tasks")  # its default --out is relative
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "oracle below 1 on 0" in checked.stdout
    assert (tmp_path / "runs" / "tasks-check" / "summary.csv").is_file()
