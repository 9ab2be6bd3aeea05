"""Real generations for storage benchmarks: recorded from vLLM at bench time, nothing committed.

``record_from_vllm(n, seed)`` builds (or reuses) the tiny model, starts the vLLM CPU server on it
(``infra.local.vllm.VLLMServer``, 20-40 s) and records ``n`` chat completions at temperature 1:
each one's generated token ids, the logprobs vLLM reported for them and its text. Prompts are
slices of this repository's source files (``SourceText``), which also serve as realistic tool
results: code and prose, as a coding agent reads them. Requests carry no seed: vLLM on CPU fails
a batch of seeded requests ("CPU Generator does not use offset"), so recordings vary per run.
"""

from __future__ import annotations

import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


class SourceText:
    """Consecutive slices of this repository's Python sources, from a seeded starting file."""

    def __init__(self, seed: int) -> None:
        files = sorted(
            p for d in ("proxy", "pipeline", "trainer", "infra") for p in (REPO / d).rglob("*.py")
        )
        random.Random(seed).shuffle(files)
        self._text = "\n".join(p.read_text() for p in files)
        self._at = 0

    def take(self, chars: int) -> str:
        if self._at + chars > len(self._text):
            self._at = 0
        out = self._text[self._at : self._at + chars]
        self._at += chars
        return out


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    text: str


@dataclass
class Recording:
    generations: list[Generation]
    tokenizer: Any

    def generation(self, turn: int) -> tuple[list[int], list[float], str]:
        g = self.generations[turn % len(self.generations)]
        return list(g.token_ids), list(g.logprobs), g.text

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        """The chat template's rendering of ``messages`` with the generation prompt, as ids."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_turn(self, tool: dict[str, Any]) -> list[int]:
        """Ids after the generated ones on an exact continuation with one tool result: the end
        of the assistant turn, the tool response as the template renders it, the next prompt."""
        text = (
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            f"{tool['content']}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def summary(self) -> str:
        lps = [lp for g in self.generations for lp in g.logprobs]
        lengths = [len(g.token_ids) for g in self.generations]
        distinct = len({round(lp, 6) for lp in lps})
        return (
            f"recorded from vLLM: {len(self.generations)} completions, {len(lps):,} generated "
            f"tokens (length {min(lengths)}-{max(lengths)}, median "
            f"{statistics.median(lengths):.0f}); logprob median {statistics.median(lps):.2f}, "
            f"p10 {sorted(lps)[len(lps) // 10]:.2f}, {distinct:,} distinct values; "
            f"{sum(len(g.text) for g in self.generations) / max(1, len(lps)):.2f} chars/token"
        )


def record_from_vllm(n: int, seed: int = 0) -> Recording:
    import httpx
    from transformers import AutoTokenizer

    from infra.local.vllm import VLLMServer
    from infra.paths import default_tiny_dir
    from infra.tiny_model import build_tiny_model

    model = build_tiny_model(default_tiny_dir(seed), seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rng = random.Random(seed)
    sources = SourceText(seed + 1)
    requests = [(sources.take(rng.randint(200, 800)), rng.randint(50, 300)) for _ in range(n)]
    with VLLMServer(model) as server, httpx.Client(timeout=300) as client:

        def one(i: int) -> Generation:
            prompt, max_tokens = requests[i]
            resp = client.post(
                f"{server.base_url}/v1/chat/completions",
                json={
                    "model": server.served_model_name,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                    "min_tokens": min(50, max_tokens),
                    "temperature": 1.0,
                    "logprobs": True,
                    "return_token_ids": True,
                },
            )
            resp.raise_for_status()
            choice = resp.json()["choices"][0]
            content = choice["logprobs"]["content"]
            assert len(content) == len(choice["token_ids"]), "one logprob per generated token"
            return Generation(
                choice["token_ids"],
                [float(c["logprob"]) for c in content],
                choice["message"]["content"] or "",
            )

        with ThreadPoolExecutor(8) as pool:
            generations = list(pool.map(one, range(n)))
    return Recording(generations, tokenizer)
