"""Rendering the chat template on a call's path: the tokenizer's own Jinja2 (transformers'
``apply_chat_template``) against MiniJinja, side by side in one run.

    .venv/bin/python -m bench.chat_template [--rounds 5] [--calls 200]

Both engines run here through the proxy's own :class:`proxy.render.Renderer`, on the tiny
model's tokenizer and chat template, in the two ways a call renders:

- a continuation (``Renderer.continuation``: the stand-in window rendered three times, the new
  turn encoded), the proxy's common case;
- a first call (``Renderer.prompt_ids``: the whole conversation rendered, the cached system
  prompt's ids reused, the rest encoded).

Conversations of ~1k and ~30k tokens (a long system prompt, four tools, tool calls and
results). Proof of path: each renderer's :class:`proxy.chat_template.TemplateStats` says which
engine rendered and how many renderings it did, printed and checked (MiniJinja past its checked
first calls, Jinja2 on every rendering of the other); the token ids of both are compared on every
case before timing. Reported: microseconds per call, best of ``--rounds`` rounds alternating
the engines, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from proxy.chat_template import VERIFIED_CALLS, TemplateEngine
from proxy.render import Renderer


def conversation(
    history_tokens: int, tokens_per_line: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A system prompt of about ``history_tokens`` tokens (``tokens_per_line``: what one line of
    it encodes to), tools, and a few turns of tool use."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool{i}",
                "description": f"Does thing {i}.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for i in range(4)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": LINE * max(1, history_tokens // tokens_per_line)},
        {"role": "user", "content": "Fix the failing test in src/app.py."},
    ]
    for i in range(3):
        args = json.dumps({"path": f"f{i}.py"})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "tool0", "arguments": args}}
        messages.append({"role": "assistant", "content": f"Reading f{i}.py.", "tool_calls": [call]})
        messages.append({"role": "tool", "content": f"line {i}\n" * 20, "tool_call_id": f"c{i}"})
    return messages, tools


LINE = "You are a coding agent. "


def _best(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _cases(renderer: Renderer, history: int) -> dict[str, Callable[[], object]]:
    messages, tools = conversation(history, len(renderer.encode(LINE)))
    base, assistant = messages[:-2], messages[-2]
    completion = renderer.encode("Reading f2.py.")
    return {
        "continuation": lambda: renderer.continuation(base, assistant, completion, messages, tools),
        "first call": lambda: renderer.prompt_ids(messages, tools),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    tok_dir = build_tiny_model(default_tiny_dir(0), seed=0)
    engines = {e: Renderer(tok_dir, engine=e) for e in (TemplateEngine.JINJA2, TemplateEngine.AUTO)}
    assert engines[TemplateEngine.AUTO].template.stats.engine == "minijinja"
    print("| history tokens | call | Jinja2 us | MiniJinja us | Jinja2 / MiniJinja |")
    print("|---|---|---|---|---|")
    for history in (1_000, 30_000):
        cases = {e: _cases(r, history) for e, r in engines.items()}
        for name in cases[TemplateEngine.AUTO]:
            fns = {e: c[name] for e, c in cases.items()}
            ids = {e: [fn() for _ in range(VERIFIED_CALLS + 1)][-1] for e, fn in fns.items()}
            assert ids[TemplateEngine.JINJA2] == ids[TemplateEngine.AUTO], (history, name)
            times: dict[TemplateEngine, list[float]] = {e: [] for e in fns}
            for _ in range(args.rounds):
                for e, fn in fns.items():
                    times[e].append(_best(fn, args.calls))
            slow, fast = (min(times[e]) for e in (TemplateEngine.JINJA2, TemplateEngine.AUTO))
            auto = engines[TemplateEngine.AUTO]
            tokens = len(auto.prompt_ids(*conversation(history, len(auto.encode(LINE)))))
            print(f"| {tokens:,} | {name} | {slow:.1f} | {fast:.1f} | {slow / fast:.2f}x |")
    for e, r in engines.items():
        s = r.template.stats
        print(
            f"{e.value}: engine {s.engine}, MiniJinja renderings {s.fast}, Jinja2 {s.slow}, "
            f"checked {s.checks}, mismatches {s.mismatches}, fallbacks {s.fallbacks}"
        )
    fast_stats, slow_stats = (
        engines[e].template.stats for e in (TemplateEngine.AUTO, TemplateEngine.JINJA2)
    )
    assert fast_stats.engine == "minijinja" and fast_stats.mismatches == 0
    assert fast_stats.fast > fast_stats.slow and slow_stats.fast == 0
    print("token ids identical on every case")


if __name__ == "__main__":
    main()
