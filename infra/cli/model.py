"""``openforge model``: build the tiny local models that tests and the demo use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.paths import cache_dir

app = typer.Typer(help="Build local models (no model hub needed).", no_args_is_help=True)


def default_tiny_dir(seed: int = 0) -> Path:
    return cache_dir() / "models" / f"tiny-seed{seed}"


@app.command("build-tiny")
def build_tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model and tokenizer to.")],
    seed: Annotated[int, typer.Option(help="Seed for the corpus, tokenizer and weights.")] = 0,
) -> None:
    """Build a tiny Qwen2-style model with a byte-level BPE tokenizer and a tool chat template."""
    from infra.tiny_model import build_tiny_model, directory_digest

    build_tiny_model(out_dir, seed=seed)
    typer.echo(f"{out_dir}  sha256:{directory_digest(out_dir)[:16]}")
