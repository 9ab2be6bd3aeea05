"""The scripted teacher of the harness-traffic warm start: a model server in vLLM's format whose
answers a script writes, so that a real harness binary, run unmodified through the proxy, makes
correct tool calls in its own tool format and the proxy records those sessions token for token.

A scripted model policy is allowed for this purpose only (issue 49): it never serves RL, and
what the tiny model learns from it are the exact token sequences the proxy recorded.

It speaks what the proxy asks of an engine: ``POST /v1/completions`` with the prompt as token
ids (streamed or not, ``token_ids`` and logprobs per choice as vLLM 0.32 returns them) and
``GET /v1/models``. What it answers, reading the prompt decoded with the tiny model's tokenizer:

- no ``<tools>`` block (a harness's side call: a title, a summary): a short plain answer;
- an echo-words instruction ("Write the word W to answer.txt.", its first place in the
  prompt: OpenClaw repeats the task in the context it appends) with no tool result after it
  yet: one call of the harness's shell tool, ``echo W > FILE``;
- a tool result after it: ``Done.``

``FILE`` is the instructed ``answer.txt`` on a word's odd demonstrations and one of
:data:`WRONG_TARGETS` on its even ones (the first, third, ... call for a word is correct), so a
recording holds correct and imperfect demonstrations of every word, told apart by the verifier's
reward. A prompt that holds no echo-words instruction is answered with a plain refusal to act.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infra.harnesses import ShellTool

INSTRUCTION = re.compile(r"Write the word (\S+) to answer\.txt\.")
TARGET = "answer.txt"
WRONG_TARGETS = ("answer.md", "answers.txt", "/tmp/answer.txt", "notes.txt")
LOGPROB = -0.125  # every scripted token's logprob (exact in float32)
DONE = "Done."
SIDE_ANSWER = "Echo task"
NO_TASK = "I can only write a word to answer.txt."


def completion_body(
    tokenizer: Any, ids: list[int], finish: str | None, model: str, cmpl_id: str, logprob: float
) -> dict[str, Any]:
    """A ``/v1/completions`` answer (or one streamed chunk) of ``ids`` as vLLM 0.32 writes it:
    ``token_ids`` and the old logprob format per choice, every token at ``logprob``."""
    return {
        "id": cmpl_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": tokenizer.decode(ids, skip_special_tokens=True),
                "logprobs": {
                    "text_offset": [0] * len(ids),
                    "token_logprobs": [logprob] * len(ids),
                    "tokens": [tokenizer.decode([i]) for i in ids],
                    "top_logprobs": [None] * len(ids),
                },
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": ids,
            }
        ],
    }


@dataclass
class Teacher:
    """Answers a harness in vLLM's format from the script above.

    Attributes:
        model_dir: the tiny model whose tokenizer encodes the answers (the proxy's).
        tool: the harness's shell tool (its name and the argument that holds the command).
        model_name: the name it serves (the proxy's upstream model).
        max_model_len: the context it reports.
        served: (word, target) of every tool call it answered, in order.
    """

    model_dir: Path
    tool: ShellTool
    model_name: str = "tiny"
    max_model_len: int = 65536
    served: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(self.model_dir))
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(end, int):
            raise TypeError(f"the tokenizer of {self.model_dir} has no <|im_end|> token")
        self.end_id = end
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}

    def answer(self, prompt_ids: list[int]) -> str:
        """The text of the answer to a prompt (token ids)."""
        text = str(self.tokenizer.decode(prompt_ids))
        if "<tools>" not in text:
            return SIDE_ANSWER
        found = INSTRUCTION.search(text)
        if found is None:
            return NO_TASK
        if "<tool_response>" in text[found.end() :]:
            return DONE
        return self._tool_call(found.group(1))

    def _tool_call(self, word: str) -> str:
        with self._lock:
            n = self._seen.get(word, 0)
            self._seen[word] = n + 1
            target = TARGET if n % 2 == 0 else WRONG_TARGETS[(n // 2) % len(WRONG_TARGETS)]
            self.served.append((word, target))
        command = f"echo {word} > {target}"
        call = {"name": self.tool.name, "arguments": {self.tool.argument: command}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    def _body(self, ids: list[int], finish: str | None) -> dict[str, Any]:
        return completion_body(
            self.tokenizer, ids, finish, self.model_name, "cmpl-teacher", LOGPROB
        )

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        text = self.answer([int(i) for i in body["prompt"]])
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_id]
        ids = ids[: int(body.get("max_tokens") or len(ids))]
        finish = "stop" if ids and ids[-1] == self.end_id else "length"
        if not body.get("stream"):
            return JSONResponse(self._body(ids, finish))

        async def events() -> AsyncIterator[bytes]:
            for n, token in enumerate(ids):
                chunk = self._body([token], finish if n == len(ids) - 1 else None)
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(self, request: Request) -> Response:
        model = {
            "id": self.model_name,
            "object": "model",
            "root": str(self.model_dir),
            "max_model_len": self.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [model]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
            ]
        )
