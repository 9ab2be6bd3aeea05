"""A fast upstream that answers in vLLM's response format, for benchmarks.

Serves ``/v1/models``, streaming ``/v1/completions`` (token-id prompts, ``token_ids`` and
``token_logprobs`` per chunk) and streaming ``/v1/chat/completions`` (``prompt_token_ids`` in the
first chunk, ``token_ids`` per chunk), each with a fixed number of generated tokens and no model,
instantly or paced like an engine decoding (``--token-delay-ms``). A negative ``temperature`` is
refused with a 400 in vLLM's error format, so tests can provoke an upstream error.

    python -m openforge.testing.fast_upstream --port 8200 --model-dir DIR --tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(model_dir: str, tokens: int, token_delay: float = 0.0) -> Starlette:
    name = "fast"

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "root": model_dir, "max_model_len": 32768}
                ],
            }
        )

    def _chunk(kind: str, i: int, prompt: list[int] | None) -> bytes:
        finish = "length" if i == tokens - 1 else None
        if kind == "completions":
            choice = {
                "index": 0,
                "text": " tok",
                "finish_reason": finish,
                "token_ids": [100 + i],
                "prompt_token_ids": prompt,
                "logprobs": {
                    "tokens": [" tok"],
                    "token_logprobs": [-1.5],
                    "text_offset": [0],
                    "top_logprobs": None,
                },
            }
            obj = "text_completion"
        else:
            choice = {
                "index": 0,
                "delta": {"content": " tok"},
                "finish_reason": finish,
                "token_ids": [100 + i],
                "logprobs": None,
            }
            obj = "chat.completion.chunk"
        body = {
            "id": "x",
            "object": obj,
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
        }
        if prompt is not None and kind == "chat":
            body["prompt_token_ids"] = prompt
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def endpoint(kind: str):  # type: ignore[no-untyped-def]
        async def run(request: Request) -> Response:
            body = orjson.loads(await request.body())
            temperature = body.get("temperature")
            if isinstance(temperature, int | float) and temperature < 0:
                # vLLM's answer to an invalid sampling parameter (status and error shape).
                message = f"temperature must be non-negative, got {temperature}."
                error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
                return JSONResponse({"error": error}, status_code=400)
            prompt = body.get("prompt") if kind == "completions" else [1, 2, 3]

            async def stream() -> AsyncIterator[bytes]:
                for i in range(tokens):
                    if token_delay:
                        await asyncio.sleep(token_delay)
                    yield _chunk(kind, i, prompt if i == 0 else None)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")

        return run

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/completions", endpoint("completions"), methods=["POST"]),
            Route("/v1/chat/completions", endpoint("chat"), methods=["POST"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="pace like an engine")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.model_dir, args.tokens, args.token_delay_ms / 1000),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
