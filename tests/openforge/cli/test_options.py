"""Commands whose options are a dataclass (``openforge.cli.options``): every field is an
option with its help and default, and the body gets the dataclass filled in as typed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from openforge.cli import proxy, rollouts, serve, services, trainer
from openforge.cli.options import options_command


@dataclass(frozen=True)
class _Options:
    name: Annotated[str, typer.Option(help="A required name.")]
    count: Annotated[int, typer.Option("--n", help="How many.")] = 2
    out: Annotated[Path, typer.Option(help="Where.", resolve_path=True)] = Path("runs/x")
    tags: Annotated[list[str] | None, typer.Option(help="Repeatable.")] = None
    dry: Annotated[bool, typer.Option(help="Only say.")] = False


def _app(seen: list[_Options]) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @options_command(_Options)
    def go(opts: _Options) -> None:
        """Go somewhere."""
        seen.append(opts)

    @app.command()
    def other() -> None:  # a second command, so that `go` is a sub-command by name
        pass

    return app


def test_the_body_gets_the_options_as_typed_with_defaults() -> None:
    seen: list[_Options] = []
    runner = CliRunner()
    done = runner.invoke(
        _app(seen), ["go", "--name", "a", "--n", "5", "--tags", "x", "--tags", "y"]
    )
    assert done.exit_code == 0, done.output
    assert seen == [_Options("a", 5, Path("runs/x").resolve(), ["x", "y"], False)]
    done = runner.invoke(_app(seen), ["go", "--help"])
    assert "Go somewhere." in done.output and "A required name." in done.output
    assert "--dry" in done.output and "--no-dry" in done.output


def test_a_missing_required_option_is_the_usual_usage_error() -> None:
    done = CliRunner().invoke(_app([]), ["go"])
    assert done.exit_code == 2 and "--name" in done.output


def test_only_a_dataclass_declares_options() -> None:
    with pytest.raises(TypeError, match="not a dataclass"):
        options_command(dict)


@pytest.mark.parametrize(
    "options",
    [
        proxy.ProxyOptions,
        rollouts.RunOptions,
        trainer.TrainerRunOptions,
        services.UpOptions,
        serve.ServeOptions,
        serve.TrafficOptions,
    ],
)
def test_the_commands_options_are_frozen_dataclasses(options: type) -> None:
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen  # type: ignore[attr-defined]
