"""Round trips of every record type through batches, frames and the archive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.archive import ArchiveWriter, read_archive
from schemas.codec import (
    Record,
    decode_batch,
    decode_message,
    encode_batch,
    encode_message,
    peek_rows,
    peek_type,
)
from schemas.completion import CompletionEvent, Timings
from schemas.enums import Dialect
from schemas.errors import SchemaError
from tests.schemas.strategies import ANY_RECORD, completions, episodes, rewards, rollouts, steps

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(
    "strategy",
    [completions, rollouts, rewards, episodes(), steps],
    ids=["completion", "rollout", "reward", "episode", "step"],
)
@SETTINGS
@given(data=st.data())
def test_batch_and_frame_round_trip(strategy: Any, data: st.DataObject) -> None:
    records = data.draw(st.lists(strategy, min_size=1, max_size=4))
    cls = type(records[0])
    assert decode_batch(cls, encode_batch(records)) == records
    for compress in (False, True):
        frame = encode_message(records, compress=compress)
        assert peek_type(frame).cls is cls
        assert peek_rows(frame) == len(records)
        assert decode_message(frame) == records


@SETTINGS
@given(records=st.lists(ANY_RECORD, min_size=1, max_size=8))
def test_archive_round_trip(
    tmp_path_factory: pytest.TempPathFactory, records: list[Record]
) -> None:
    root = tmp_path_factory.mktemp("archive")
    ArchiveWriter(root).write(records)
    for cls in {type(r) for r in records}:
        expected = sorted((r for r in records if type(r) is cls), key=repr)
        assert sorted(read_archive(root, cls), key=repr) == expected


def _event(**kw: Any) -> CompletionEvent:
    base: dict[str, Any] = dict(
        event_id="e",
        rollout_id="r",
        call_index=0,
        dialect=Dialect.CHAT,
        streamed=False,
        model="m",
        timings=Timings(received_us=1_700_000_000_000_000),
    )
    return CompletionEvent(**{**base, **kw})


def test_empty_and_huge_payloads_round_trip(tmp_path: Path) -> None:
    empty = _event(model="", request_body="", response_body="")
    huge = _event(
        event_id="huge",
        prompt_token_ids=list(range(1_000_000)),
        prompt_length=1_000_000,
        completion_token_ids=[7] * 200_000,
        completion_logprobs=[-0.5] * 200_000,
        request_body=json.dumps({"messages": [{"role": "user", "content": "ü" * 5_000_000}]}),
    )
    for record in (empty, huge):
        assert decode_message(encode_message([record], compress=True)) == [record]
    ArchiveWriter(tmp_path).write([empty, huge])
    assert sorted(read_archive(tmp_path, CompletionEvent), key=lambda e: e.event_id) == [
        empty,
        huge,
    ]


def test_unicode_payloads_round_trip() -> None:
    text = "naïve 日本語 🚀 \u200b \x00 مرحبا"
    record = _event(model=text, error=text, response_body=json.dumps({"t": text}))
    assert decode_message(encode_message([record])) == [record]


def test_bad_records_and_frames_are_refused_clearly() -> None:
    with pytest.raises(SchemaError, match="does not fit its schema"):
        encode_batch([_event(prompt_token_ids=[2**40])])
    with pytest.raises(SchemaError, match="bad magic"):
        decode_message(b"XX" + b"\0" * 20)
    frame = bytearray(encode_message([_event()]))
    frame[4] = 1  # claim zstd on an uncompressed body
    with pytest.raises(SchemaError):
        decode_message(bytes(frame))
    with pytest.raises(SchemaError, match="shorter than its header"):
        decode_message(b"OF")
    whole = encode_message([_event()])
    with pytest.raises(SchemaError, match="corrupt completion frame"):
        peek_rows(whole[:12])  # the header, then the Arrow message cut short
    with pytest.raises(SchemaError, match="bad magic"):
        peek_rows(b"XX" + whole[2:])


# One byte of the default event's frame, found by fuzzing: its Arrow body then claims a column
# length that reads past its buffers, and reading its rows used to crash the interpreter.
_CRASHING_BYTE = (2962, 216)
_DECODE_DAMAGED = """
import sys
from schemas.codec import decode_message
from schemas.errors import SchemaError
from tests.schemas.test_codec import _CRASHING_BYTE, _event
from schemas.codec import encode_message
frame = bytearray(encode_message([_event()]))
frame[_CRASHING_BYTE[0]] = _CRASHING_BYTE[1]
try:
    decode_message(bytes(frame))
except SchemaError as exc:
    print("refused:", exc)
"""


def test_a_frame_whose_body_reads_past_its_buffers_is_refused_not_a_crash() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _DECODE_DAMAGED], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, f"decode crashed ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("refused: corrupt completion frame"), done.stdout
