"""A scripted model policy: answers ``/v1/completions`` in vLLM's format from a script.

Allowed by issue 5 for the multi-turn harness tests: the harness, the proxy and the event log are
real; only the model's choices are scripted, so that a tool call in the harness's own schema
happens on cue. The answers carry token ids from the tiny model's tokenizer and logprobs, exactly
as vLLM streams them (``return_token_ids``, ``logprobs: 0``), so the proxy cannot tell the
difference.

What it answers depends on the prompt it is given (decoded with the same tokenizer):

- no ``<tools>`` block (a harness's side call: titles, summaries): a short plain answer;
- no ``<tool_response>`` yet: the script's tool call, in the hermes format of the chat template;
- otherwise: the script's final answer (or, with ``Script.plans``, the plan's next tool call).

With ``drop_stream_once`` the first tool-call answer is cut off mid-stream (the connection closes
without the end of the chunked body), once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from transformers import AutoTokenizer

from openforge.threaded import serve_in_thread
from openforge.train.teacher import completion_body

LOGPROB = -0.125  # every scripted token's logprob (exact in float32)


class StreamDropped(Exception):
    """Raised inside the response body to close the connection mid-stream."""


def _is_drop(exc: BaseException | None) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_drop(e) for e in exc.exceptions)
    return isinstance(exc, StreamDropped)


class _QuietDrops(logging.Filter):
    """Keep the scripted drops out of uvicorn's error log (they are intended)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and _is_drop(record.exc_info[1]))


@dataclass
class Script:
    """What the policy says: one tool call, then a final answer. With ``plans``, a prompt that
    holds one of its markers gets that plan's tool calls instead, one per turn (the N-th once N
    tool results are in the prompt), then the final answer: a script of known errors and
    recoveries, task by task."""

    tool_name: str
    arguments: dict[str, Any]
    final: str = "Done: the file is written."
    side_answer: str = "File task"
    drop_stream_once: bool = False
    drop_after: int = 3  # tokens sent before the drop
    # A plan's step: the script's tool's arguments, or (another tool's name, its arguments).
    plans: dict[str, list[dict[str, Any] | tuple[str, dict[str, Any]]]] = field(
        default_factory=dict
    )

    def next_call(self, prompt: str) -> tuple[str, dict[str, Any]] | None:
        """The tool call (name, arguments) for this prompt; None: the final answer is due."""
        done = prompt.count("<tool_response>")
        for marker, calls in self.plans.items():
            if marker in prompt:
                if done >= len(calls):
                    return None
                step = calls[done]
                return step if isinstance(step, tuple) else (self.tool_name, step)
        return (self.tool_name, self.arguments) if done == 0 else None


@dataclass
class Served:
    """One answered call, for the test to inspect."""

    kind: str  # side | tool_call | final
    prompt_len: int
    dropped: bool
    stream: bool


@dataclass
class ScriptedPolicy:
    model_dir: Path
    script: Script
    model_name: str = "tiny"
    max_model_len: int = 262144
    calls: list[Served] = field(default_factory=list)
    _dropped: bool = False

    def __post_init__(self) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert isinstance(end, int), end
        self.end_id = end
        self._lock = threading.Lock()

    def answer(self, prompt_ids: list[int]) -> tuple[str, str]:
        text = str(self.tokenizer.decode(prompt_ids))
        if "<tools>" not in text:
            return "side", self.script.side_answer
        step = self.script.next_call(text)
        if step is not None:
            call = {"name": step[0], "arguments": step[1]}
            return "tool_call", f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return "final", self.script.final

    def _chunk(self, ids: list[int], finish: str | None) -> dict[str, Any]:
        return completion_body(
            self.tokenizer, ids, finish, self.model_name, "cmpl-scripted", LOGPROB
        )

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        prompt = [int(i) for i in body["prompt"]]
        kind, text = self.answer(prompt)
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_id]
        ids = ids[: int(body.get("max_tokens") or len(ids))]
        finish = "stop" if ids and ids[-1] == self.end_id else "length"
        with self._lock:
            drop = self.script.drop_stream_once and kind == "tool_call" and not self._dropped
            self._dropped = self._dropped or drop
            self.calls.append(Served(kind, len(prompt), drop, bool(body.get("stream"))))
        if not body.get("stream"):
            return JSONResponse(self._chunk(ids, finish))

        async def events() -> AsyncIterator[bytes]:
            for n, token in enumerate(ids):
                if drop and n == self.script.drop_after:
                    raise StreamDropped("scripted drop")
                last = n == len(ids) - 1
                chunk = self._chunk([token], finish if last else None)
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "root": str(self.model_dir),
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )


@contextmanager
def serving(policy: ScriptedPolicy) -> Iterator[str]:
    """Serve the policy on a free loopback port; yields its base URL."""
    logging.getLogger("uvicorn.error").addFilter(_QuietDrops())
    with serve_in_thread(policy.app(), "scripted policy", log_level="critical") as url:
        yield url
