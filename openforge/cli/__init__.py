"""The ``openforge`` command line. Each part registers its sub-commands here."""

from __future__ import annotations

import typer

from openforge.cli import (
    audit,
    model,
    pipeline,
    proxy,
    query,
    replay,
    rollout,
    rollouts,
    serve,
    services,
    tasks,
    train,
    trainer,
)

app = typer.Typer(
    name="openforge",
    help="Train LLM agents with RL inside their real harnesses.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(services.app, name="services")
app.add_typer(model.app, name="model")
app.add_typer(pipeline.app, name="pipeline")
app.add_typer(trainer.app, name="trainer")
app.add_typer(rollouts.app, name="rollouts")
app.add_typer(tasks.app, name="tasks")
app.add_typer(rollout.app, name="rollout")
app.add_typer(replay.app, name="replay")
app.command("train")(train.train)
app.command("demo")(train.demo)
app.command("proxy")(proxy.proxy)
app.command("query")(query.query)
app.command("audit")(audit.audit)
app.command("serve")(serve.serve)
app.command("traffic")(serve.traffic)


@app.command()
def version() -> None:
    """Print the installed OpenForge version and the pinned service versions."""
    from importlib.metadata import version as dist_version

    from infra.paths import versions

    typer.echo(f"openforge {dist_version('openforge')}")
    for key, value in versions().items():
        typer.echo(f"  {key.lower()}: {value}")


def main() -> None:
    """Console-script entry point: our errors print their message, not a traceback."""
    from rich.console import Console

    from schemas.errors import OpenForgeError

    try:
        app()
    except OpenForgeError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}")  # paths unbroken
        raise SystemExit(1) from None
