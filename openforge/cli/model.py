"""``openforge model``: build the tiny local models that tests and the demo use."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer

from infra.paths import default_tiny_dir

app = typer.Typer(help="Build local models (no model hub needed).", no_args_is_help=True)


@app.command("build-tiny")
def build_tiny(
    out_dir: Annotated[
        Path | None,
        typer.Argument(
            help="Directory to write the model to (default: under the cache).", resolve_path=True
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for the corpus, tokenizer and weights.")] = 0,
    context: Annotated[
        int,
        typer.Option(help="Context window in tokens (the real harnesses send 17k-31k)."),
    ] = 4096,
) -> None:
    """Build a tiny Qwen2-style model with a byte-level BPE tokenizer and a tool chat template."""
    from infra.tiny_model import TinyModelSpec, build_tiny_model, directory_digest

    out_dir = out_dir or default_tiny_dir(seed, context)
    build_tiny_model(out_dir, seed=seed, spec=TinyModelSpec(max_position_embeddings=context))
    typer.echo(f"{out_dir}  sha256:{directory_digest(out_dir)[:16]}")


@app.command("warm-start")
def warm_start_cmd(
    config: Annotated[
        Path | None, typer.Argument(help="A train config (default: the demo's).", resolve_path=True)
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a config field: section.key=value (repeatable)."),
    ] = None,
) -> None:
    """Build (or find in the cache) the warm-started model a train config starts from."""
    from openforge.cli.train import DEMO_CONFIG
    from openforge.cli.userns import enter_for_containers
    from openforge.train.config_io import load_config
    from openforge.train.launch import prepare_model
    from openforge.train.warm_start_config import WarmStartRecipe

    cfg = load_config(config or DEMO_CONFIG, [*(set_ or [])])
    if cfg.warm_start.recipe is WarmStartRecipe.HARNESS_TRAFFIC:  # it plays tasks in sandboxes
        enter_for_containers(cfg.rollouts.sandbox)
        # SIGTERM unwinds like Ctrl-C (as in `openforge train`): the sandboxes, the proxy and
        # the teacher are stopped, not left running.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    typer.echo(prepare_model(cfg, say=typer.echo))


@app.command("sample")
def sample(
    prompt: Annotated[str, typer.Option(help="The user message.")] = "Write hello world to a file.",
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed of the tiny model.")] = 0,
) -> None:
    """Serve the tiny model with vLLM and show one completion's token ids and logprobs."""
    import httpx
    from rich.console import Console
    from rich.table import Table

    from infra.local.vllm import VLLMServer
    from infra.tiny_model import build_tiny_model

    console = Console(soft_wrap=True)  # a path is never broken across lines
    model = build_tiny_model(default_tiny_dir(seed), seed=seed)
    with console.status("starting vLLM (20-40 s on CPU)"), VLLMServer(model) as server:
        resp = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={
                "model": server.served_model_name,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "seed": seed,
                "logprobs": True,
                "return_token_ids": True,
            },
            timeout=120,
        )
        resp.raise_for_status()
        body = resp.json()
    choice = body["choices"][0]
    console.print(f"prompt token ids ({len(body['prompt_token_ids'])}): {body['prompt_token_ids']}")
    table = Table("#", "token id", "text", "logprob")
    for i, (tid, lp) in enumerate(
        zip(choice["token_ids"], choice["logprobs"]["content"], strict=True)
    ):
        table.add_row(str(i), str(tid), repr(lp["token"]), f"{lp['logprob']:.4f}")
    console.print(table)
