"""Encoding a completion event's frame: the codec's struct-array path against the per-column
``RecordBatch.from_pylist`` path it replaced, side by side in one run.

    .venv/bin/python -m bench.codec_encode [--repeat 2000]

Both paths run here on the same events and must produce byte-identical frames (checked first):

- baseline: the code before this bench (``to_row`` looking up ``dataclasses.fields`` on every
  record, then ``pa.RecordBatch.from_pylist`` with the schema: one ``pa.array`` per column);
- ``schemas.codec.encode_message`` as it is: field names cached per type, the rows converted
  once as a struct array (``pa.array`` of the schema's struct type), the batch taken from it.

Events: a continuation call as the proxy records it (a short prompt suffix in delta form, 16
completion tokens with logprobs, request and response bodies) and a first call of a ~30k-token
history (the whole prompt's ids). Reported: microseconds per frame (best of 5 rounds, alternating
the paths) and the ratio baseline / current.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import struct
import time
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Any

import pyarrow as pa

from schemas.codec import encode_message, record_type
from schemas.completion import CompletionEvent, SamplingParams, Timings, Usage
from schemas.enums import ContinuityClass, Dialect

_HEADER = struct.Struct(">2sBBBH")


def _old_to_row(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _old_to_row(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return [(k, _old_to_row(v)) for k, v in value.items()]
    if isinstance(value, list):
        first = value[0] if value else None
        if first is None or (isinstance(first, int | float | str) and not isinstance(first, Enum)):
            return value
        return [_old_to_row(v) for v in value]
    return value


def baseline(records: list[CompletionEvent]) -> bytes:
    """The frame as the codec built it before: from_pylist, one pa.array per column."""
    rtype = record_type(records[0])
    rows = [_old_to_row(r) for r in records]
    for row in rows:
        row["schema_version"] = rtype.version
    batch = pa.RecordBatch.from_pylist(rows, schema=rtype.schema_with_metadata())
    header = _HEADER.pack(b"OF", 1, rtype.type_id, 0, rtype.version)
    return header + bytes(batch.serialize().to_pybytes())


def event(prompt_ids: int, index: int) -> CompletionEvent:
    body = {"messages": [{"role": "user", "content": "run the tests " * 8}], "stream": True}
    return CompletionEvent(
        event_id=f"ev-{index}", rollout_id="r-1", call_index=index, dialect=Dialect.CHAT,
        streamed=True, model="agent", timings=Timings(1_000_000, 1_002_000, 1_010_000),
        task_id="task", harness="codex", sampling=SamplingParams(temperature=1.0, max_tokens=64),
        prompt_ref_event_id=f"ev-{index - 1}" if index else None,
        prompt_ref_tokens=30_000 if index else 0,
        prompt_token_ids=list(range(prompt_ids)), prompt_length=30_000 + prompt_ids,
        completion_token_ids=list(range(100, 116)), completion_logprobs=[-0.25] * 16,
        finish_reason="stop", usage=Usage(30_000 + prompt_ids, 16),
        continuity=ContinuityClass.EXACT if index else ContinuityClass.FIRST,
        request_body=json.dumps(body), response_body=json.dumps({"content": "ok " * 16}),
    )  # fmt: skip


def best_us(fn: Callable[[], object], repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    cases = {
        "continuation (40-token suffix)": [event(40, 7)],
        "first call (30,000 prompt ids)": [event(30_000, 0)],
        "batch of 8 continuations": [event(40, i + 1) for i in range(8)],
    }
    print("| event | baseline us | current us | baseline / current |\n|---|---|---|---|")
    for name, records in cases.items():
        if baseline(records) != encode_message(records):
            raise SystemExit(f"{name}: the two paths' frames differ")
        repeat = max(20, args.repeat // (50 if len(records[0].prompt_token_ids) > 1000 else 1))
        old, new = [], []
        for _ in range(5):  # alternate, keep each path's best round
            old.append(best_us(partial(baseline, records), repeat))
            new.append(best_us(partial(encode_message, records), repeat))
        print(f"| {name} | {min(old):.1f} | {min(new):.1f} | {min(old) / min(new):.2f}x |")
    print("\nframes byte-identical on every event")


if __name__ == "__main__":
    main()
