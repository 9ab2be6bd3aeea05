"""Bytes per event and per rollout: delta form vs full form, frames and Parquet.

    .venv/bin/python -m bench.schema_storage [--turns 20 100] [--seed 0] [--no-vllm]

A coding-agent rollout in the Chat Completions dialect: every turn the harness resends the whole
history plus a tool result (300-1500 characters) and the model answers with a tool call (50-300
tokens, with logprobs). "Unique" bytes are what the rollout holds once: each token id and each
generated token's logprob at 4 bytes, plus the final history's JSON and the last response's.

Two rollouts of that shape, side by side:
- ``synthetic``: random token ids, constant logprobs, text from a 20-word list (the first
  version of this bench);
- ``recorded``: every turn's generation is a real completion recorded at bench time from vLLM
  (CPU, the tiny model, temperature 1; ``bench.vllm_recording``): its token ids, its logprobs
  and its text (the tool call's argument); tool results are slices of this repository's source
  files, and the prompt grows as the proxy builds it on an exact continuation (the previous
  prompt, the generated ids, then the tokenizer's ids of the appended turn).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from bench.vllm_recording import Recording, SourceText, record_from_vllm
from schemas.archive import ArchiveWriter
from schemas.codec import encode_message
from schemas.completion import CompletionEvent, PolicySpan, SamplingParams, Timings, Usage
from schemas.delta import DeltaEncoder, dump_json
from schemas.enums import ContinuityClass, Dialect

WORDS = (
    "def return import self value path data error result file read write test run the a of".split()
)


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rng.choice(WORDS))
    return " ".join(out)


Call = tuple[list[int], list[int], list[float], dict[str, Any], str]


def synthetic_rollout(turns: int, seed: int, recorded: Recording | None = None) -> list[Call]:
    """(prompt ids, completion ids, logprobs, request body, response body) per call; with a
    recording, its generations, the tokenizer's ids and real text instead of random ones."""
    rng = random.Random(seed)
    sources = SourceText(seed) if recorded else None
    history: list[dict[str, Any]] = [
        {"role": "system", "content": _text(rng, 2000)},
        {"role": "user", "content": _text(rng, 300)},
    ]
    prompt = [rng.randrange(50_000) for _ in range(650)]
    calls = []
    if recorded is not None:
        assert sources is not None
        history[0]["content"] = sources.take(2000)
        history[1]["content"] = sources.take(300)
        prompt = recorded.encode(history)
    for turn in range(turns):
        if recorded is None:
            completion = [rng.randrange(50_000) for _ in range(rng.randint(50, 300))]
            logprobs = [-1.25] * len(completion)
            args = _text(rng, len(completion) * 3)
        else:
            completion, logprobs, args = recorded.generation(turn)
        body = {
            "model": "agent",
            "messages": list(history),
            "stream": True,
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "shell", "parameters": {"type": "object"}},
                }
            ],
        }
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": "shell", "arguments": json.dumps({"cmd": args})},
                }
            ],
        }
        response = dump_json(
            {
                "id": f"chatcmpl-{turn}",
                "object": "chat.completion",
                "model": "agent",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
            }
        )
        calls.append((list(prompt), completion, logprobs, body, response))
        chars = rng.randint(300, 1500)
        tool_output = sources.take(chars) if sources else _text(rng, chars)
        tool = {"role": "tool", "tool_call_id": f"call_{turn}", "content": tool_output}
        history += [message, tool]
        appended = (
            recorded.encode_turn(tool)
            if recorded is not None
            else [rng.randrange(50_000) for _ in range(len(tool_output) // 4)]
        )
        prompt = prompt + completion + appended
    return calls


def events(calls: list[Any], delta: bool) -> list[CompletionEvent]:
    encoder = DeltaEncoder()
    out = []
    for i, (prompt, completion, logprobs, body, response) in enumerate(calls):
        eid = f"rollout-0001/{i:04d}"
        if delta:
            pdelta, hdelta = encoder.encode("thread", eid, Dialect.CHAT, prompt, completion, body)
            assert hdelta is not None
            ref, ref_tokens, suffix = pdelta.ref_event_id, pdelta.ref_tokens, pdelta.suffix
            href, hprefix, body_json = hdelta.ref_event_id, hdelta.prefix, hdelta.body_json
        else:
            ref, ref_tokens, suffix, href, hprefix, body_json = (
                None,
                0,
                prompt,
                None,
                0,
                dump_json(body),
            )
        out.append(
            CompletionEvent(
                event_id=eid,
                rollout_id="rollout-0001",
                call_index=i,
                dialect=Dialect.CHAT,
                streamed=True,
                model="agent",
                timings=Timings(1_796_000_000_000_000 + i * 1000),
                task_id="task-1",
                harness="codex",
                thread_id="thread",
                sampling=SamplingParams(1.0),
                prompt_ref_event_id=ref,
                prompt_ref_tokens=ref_tokens,
                prompt_token_ids=suffix,
                prompt_length=len(prompt),
                completion_token_ids=completion,
                completion_logprobs=logprobs,
                policy_versions=[PolicySpan(0, 0, len(completion))],
                finish_reason="tool_calls",
                usage=Usage(len(prompt), len(completion)),
                continuity=ContinuityClass.EXACT if i else ContinuityClass.FIRST,
                request_history_ref=href,
                request_history_prefix=hprefix,
                request_body=body_json,
                response_body=response,
            )
        )
    return out


def unique_bytes(calls: list[Any]) -> int:
    last_prompt, last_completion, _, last_body, last_response = calls[-1]
    tokens = len(last_prompt) + len(last_completion)
    logprobs = sum(len(c[1]) for c in calls)
    text = len(dump_json(last_body["messages"]).encode()) + len(last_response.encode())
    return 4 * tokens + 4 * logprobs + text


def measure(turns: int, seed: int, recorded: Recording | None = None) -> dict[str, float]:
    calls = synthetic_rollout(turns, seed, recorded)
    unique = unique_bytes(calls)
    row: dict[str, float] = {"turns": turns, "unique": unique}
    for form, delta in (("full", False), ("delta", True)):
        evs = events(calls, delta)
        row[f"{form}_frame"] = sum(len(encode_message([e])) for e in evs)
        row[f"{form}_frame_zstd"] = sum(len(encode_message([e], compress=True)) for e in evs)
        with tempfile.TemporaryDirectory() as tmp:
            (path,) = ArchiveWriter(Path(tmp)).write(evs)
            row[f"{form}_parquet"] = path.stat().st_size
            assert pq.read_metadata(path).num_rows == turns
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-vllm", action="store_true", help="the synthetic rollout only")
    args = parser.parse_args()
    rollouts: list[tuple[str, Recording | None]] = [("synthetic", None)]
    if not args.no_vllm:
        recording = record_from_vllm(max(args.turns), args.seed)
        print(recording.summary() + "\n")
        rollouts.append(("recorded", recording))
    print(
        "| rollout | turns | unique B | form | frames B (per event) | frames zstd B (per event) "
        "| Parquet zstd B | x unique (zstd frames / Parquet) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, recorded in rollouts:
        for turns in args.turns:
            row = measure(turns, args.seed, recorded)
            for form in ("full", "delta"):
                f, z, p = row[f"{form}_frame"], row[f"{form}_frame_zstd"], row[f"{form}_parquet"]
                print(
                    f"| {name} | {turns} | {row['unique']:,.0f} | {form} | "
                    f"{f:,.0f} ({f / turns:,.0f}) | {z:,.0f} ({z / turns:,.0f}) | {p:,.0f} | "
                    f"{z / row['unique']:.2f} / {p / row['unique']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
