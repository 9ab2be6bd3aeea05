"""Schema evolution: every version stays readable; a change without a version bump fails."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.archive import read_archive
from schemas.codec import FROZEN_DIR, REGISTRY, decode_batch, decode_message, encode_batch
from schemas.completion import CompletionEvent, Timings
from schemas.enums import ContinuityClass, Dialect
from schemas.errors import SchemaError
from tests.schemas.golden import DATA, RECORDS, read_frames


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_current_schema_is_frozen(name: str) -> None:
    rtype = REGISTRY[name]
    frozen = pa.ipc.read_schema(
        pa.py_buffer((FROZEN_DIR / f"{name}-v{rtype.version}.arrow").read_bytes())
    )
    assert frozen.equals(rtype.schema), (
        f"the {name} schema changed without a version bump: bump its version, add only optional "
        "fields, and run `python -m schemas.freeze`"
    )


def test_files_written_by_version_1_are_read() -> None:
    archive = DATA / "v1" / "archive"
    for rtype in REGISTRY.values():
        expected = [r for r in RECORDS if isinstance(r, rtype.cls)]
        assert list(read_archive(archive, rtype.cls)) == expected
    assert [
        r for f in read_frames(DATA / "v1" / "frames.bin") for r in decode_message(f)
    ] == RECORDS


def test_a_writer_without_the_optional_fields_is_read_with_defaults(tmp_path: Path) -> None:
    """An older writer that did not know the optional fields yet: they take their defaults."""
    record = CompletionEvent(
        "e", "r", 0, Dialect.CHAT, False, "m", Timings(1), prompt_token_ids=[1], prompt_length=1
    )
    full = pa.Table.from_batches([encode_batch([record])])
    optional = [f.name for f in full.schema if f.nullable]
    older = full.drop_columns([*optional, "continuity", "side_call", "redacted"])
    path = tmp_path / "older.parquet"
    pq.write_table(older, path)
    (decoded,) = decode_batch(CompletionEvent, pq.read_table(path))
    assert decoded == record
    assert decoded.continuity is ContinuityClass.FIRST and decoded.retry_of is None


def test_a_newer_version_is_refused_with_upgrade_advice() -> None:
    record = CompletionEvent("e", "r", 0, Dialect.CHAT, False, "m", Timings(1))
    batch = encode_batch([record])
    newer = batch.replace_schema_metadata(
        {"openforge.record": "completion", "openforge.version": "99"}
    )
    with pytest.raises(SchemaError, match="upgrade openforge"):
        decode_batch(CompletionEvent, newer)
