"""Parsing a request body: the proxy's path before and after its checks were cut to one walk,
and msgspec, side by side in one run.

    .venv/bin/python -m bench.body_parse [--rounds 5] [--calls 300]

A Chat Completions body as a harness sends it each turn (four tools, the whole history: a long
system prompt, tool calls and results), of ~1k and ~30k tokens, parsed four ways:

- baseline: the proxy's parse before (orjson, a scan of the raw bytes for runs of 19 digits,
  then a walk of the containers for the depth), copied here;
- the proxy's :func:`proxy.bodies.parse_json` now (orjson, then one walk for the depth and for
  floats past 2**63, the only trace an integer past 64 bits leaves in orjson's result);
- either, then the dialect's own checks and conversion (``proxy.dialects.chat.parse``);
- ``msgspec`` typed: ``msgspec.json.Decoder`` into Structs of the request's shape, validating
  types while it decodes. This path stops at the Structs: it does not build the proxy's
  ``CallRequest`` (the conversion the dialect parse also does), so its time is a lower bound of
  what a typed parse would cost;
- the JSON decode alone, both libraries, for scale.

msgspec is not a dependency (it is on trial here): it is installed on first use into the cache
(``bench/packages.py``). Proof of path: every path's result is checked against the proxy's
(the same messages and tools) before timing. Reported: microseconds per body, best of
``--rounds`` rounds alternating the paths.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from bench.packages import importable
from proxy.bodies import MAX_DEPTH, parse_json
from proxy.dialects import chat
from proxy.errors import ProxyError

MSGSPEC = "0.22.0"


def body(history_tokens: int) -> bytes:
    """A Chat Completions request of about ``history_tokens`` tokens (~4 characters a token)."""
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "description": f"Does {i}.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
        for i in range(4)
    ]  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * (history_tokens // 8)},
        {"role": "user", "content": "Fix the failing test."},
    ]
    for i in range(8):
        args = json.dumps({"path": f"f{i}.py"})
        call = {"id": f"c{i}", "type": "function", "function": {"name": "tool0", "arguments": args}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\n" * 40})
    request = {"model": "m", "messages": messages, "tools": tools, "stream": True}
    return json.dumps({**request, "max_tokens": 64, "temperature": 1.0}).encode()


def baseline_parse(raw: bytes) -> Any:
    """The proxy's parse before this bench (its fallback to the standard library left out: the
    bench's bodies never take it)."""
    import orjson

    if b"0" * 19 in raw.translate(bytes.maketrans(b"0123456789", b"0" * 10)):
        raise ValueError("the bench's bodies hold no run of 19 digits")
    value = orjson.loads(raw)
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProxyError(400, "nested too deep")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((v, depth + 1) for v in children if isinstance(v, dict | list))
    return value


def typed_decoder() -> Any:
    """A msgspec decoder into Structs of a Chat Completions request's shape."""
    import msgspec
    from msgspec import defstruct

    function = defstruct("Function", [("name", str), ("arguments", str | dict[str, Any], "")])
    call = defstruct("ToolCall", [("function", function), ("id", str, ""), ("type", str, "")])
    message = defstruct(
        "Message",
        [
            ("role", str),
            ("content", str | list[dict[str, Any]] | None, None),
            ("tool_calls", list[call] | None, None),  # type: ignore[valid-type]
            ("tool_call_id", str | None, None),
            ("name", str | None, None),
        ],
    )
    tool_function = defstruct(
        "ToolFunction",
        [("name", str), ("description", str, ""), ("parameters", dict[str, Any] | None, None)],
    )
    tool = defstruct("Tool", [("function", tool_function), ("type", str, "function")])
    request = defstruct(
        "Request",
        [
            ("model", str),
            ("messages", list[message]),  # type: ignore[valid-type]
            ("tools", list[tool], []),  # type: ignore[valid-type]
            ("stream", bool, False),
            ("max_tokens", int | None, None),
            ("temperature", float | None, None),
        ],
    )
    return msgspec.json.Decoder(request)


def _paths(raw: bytes, decoder: Any) -> dict[str, Callable[[], object]]:
    import msgspec
    import orjson

    return {
        "baseline: orjson + byte scan + depth walk (before)": lambda: baseline_parse(raw),
        "parse_json now: orjson + one walk": lambda: parse_json(raw),
        "baseline + dialect parse": lambda: chat.parse(baseline_parse(raw)),
        "parse_json now + dialect parse": lambda: chat.parse(parse_json(raw)),
        "msgspec typed, into Structs only": lambda: decoder.decode(raw),
        "orjson.loads alone": lambda: orjson.loads(raw),
        "msgspec.json.decode alone": lambda: msgspec.json.decode(raw),
    }


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    importable("msgspec", MSGSPEC)
    import msgspec
    import orjson

    decoder = typed_decoder()
    print(f"msgspec {msgspec.__version__}, orjson {orjson.__version__}")
    print("| history tokens (body bytes) | path | us per body | baseline / this |")
    print("|---|---|---|---|")
    for history in (1_000, 30_000):
        raw = body(history)
        expected = chat.parse(parse_json(raw))
        assert baseline_parse(raw) == parse_json(raw) == msgspec.json.decode(raw)
        typed = decoder.decode(raw)
        assert [m.role for m in typed.messages] == [m["role"] for m in expected.messages]
        assert len(typed.tools) == len(expected.tools)
        paths = _paths(raw, decoder)
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.rounds):
            for name, fn in paths.items():
                times[name].append(_per_call(fn, args.calls))
        base = min(next(iter(times.values())))
        for name, t in times.items():
            print(f"| {history:,} ({len(raw):,}) | {name} | {min(t):.1f} | {base / min(t):.2f}x |")
    print("every path's result checked against the proxy's before timing")


if __name__ == "__main__":
    main()
