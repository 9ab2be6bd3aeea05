"""``openforge demo``: the main job on a fresh machine.

For now: build the tiny model, start vLLM on it, send one chat completion, and print the engine's
token ids and logprobs. The CPU training run replaces it when the trainer lands.
"""

from __future__ import annotations

from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.table import Table


def demo(
    seed: Annotated[int, typer.Option(help="Seed of the tiny model.")] = 0,
    prompt: Annotated[str, typer.Option(help="The user message.")] = "Write hello world to a file.",
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate.")] = 16,
) -> None:
    """Build the tiny model, serve it with vLLM, show one completion's token ids and logprobs."""
    from infra.cli.model import default_tiny_dir
    from infra.local.vllm import VLLMServer
    from infra.tiny_model import build_tiny_model

    console = Console()
    with console.status("building the tiny model"):
        model = build_tiny_model(default_tiny_dir(seed), seed=seed)
    console.print(f"model: {model}")
    server = VLLMServer(model)
    try:
        with console.status("starting vLLM (20-40 s on CPU)"):
            server.start()
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
    finally:
        server.stop()
    choice = body["choices"][0]
    console.print(f"prompt token ids ({len(body['prompt_token_ids'])}): {body['prompt_token_ids']}")
    table = Table("#", "token id", "text", "logprob")
    for i, (tid, lp) in enumerate(
        zip(choice["token_ids"], choice["logprobs"]["content"], strict=True)
    ):
        table.add_row(str(i), str(tid), repr(lp["token"]), f"{lp['logprob']:.4f}")
    console.print(table)
    console.print(f"finish_reason: {choice['finish_reason']}")
