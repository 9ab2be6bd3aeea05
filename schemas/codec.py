"""Records to Arrow and back: record batches, Kafka message frames, and older schema versions.

Conversion is driven by the dataclass's type hints and the record's Arrow schema, by field name,
so a reader decodes any older version of a record: fields the writer did not know take their
defaults. A record from a newer, unknown version is refused with :class:`SchemaError`.

Frame of one Kafka message (or one local-log entry), big-endian::

    b"OF" | frame version (u8) | record type id (u8) | codec (u8) | schema version (u16) | body

where the body is one Arrow IPC record-batch message (one or more rows) without the schema (the
reader knows it by type id and version), optionally zstd-compressed.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from schemas.completion import COMPLETION_SCHEMA, CompletionEvent
from schemas.episode import EPISODE_SCHEMA, Episode
from schemas.errors import SchemaError
from schemas.reward import REWARD_SCHEMA, RewardEvent
from schemas.rollout import ROLLOUT_SCHEMA, RolloutEvent
from schemas.step import STEP_SCHEMA, TrainingStep

# Records of one rollout (published keyed by its id), and every record type.
RolloutRecord = CompletionEvent | RolloutEvent | RewardEvent | Episode
Record = RolloutRecord | TrainingStep
R = TypeVar("R", CompletionEvent, RolloutEvent, RewardEvent, Episode, TrainingStep)
T = TypeVar("T")

FROZEN_DIR = Path(__file__).with_name("frozen")
_MAGIC = b"OF"
_FRAME_VERSION = 1
_HEADER = struct.Struct(">2sBBBH")
CODEC_NONE, CODEC_ZSTD = 0, 1
MAX_FRAME_BODY = 1 << 31  # 2 GiB: Arrow's 32-bit offsets bound one batch anyway


@dataclass(frozen=True)
class RecordType:
    """A record type's registry entry: its class, wire id, current schema and partition time."""

    name: str
    type_id: int
    cls: type[Any]
    schema: pa.Schema
    version: int
    time_us: Callable[[Any], int]  # the instant that decides the archive partition (date)

    def schema_with_metadata(self) -> pa.Schema:
        return self.schema.with_metadata(
            {"openforge.record": self.name, "openforge.version": str(self.version)}
        )


REGISTRY: dict[str, RecordType] = {
    t.name: t
    for t in (
        RecordType(
            "completion", 1, CompletionEvent, COMPLETION_SCHEMA, 3, lambda r: r.timings.received_us
        ),
        RecordType("rollout", 2, RolloutEvent, ROLLOUT_SCHEMA, 4, lambda r: r.at_us),
        RecordType("reward", 3, RewardEvent, REWARD_SCHEMA, 2, lambda r: r.at_us),
        RecordType("episode", 4, Episode, EPISODE_SCHEMA, 3, lambda r: r.created_us),
        RecordType("step", 5, TrainingStep, STEP_SCHEMA, 1, lambda r: r.at_us),
    )
}
_BY_ID = {t.type_id: t for t in REGISTRY.values()}
_BY_CLS = {t.cls: t for t in REGISTRY.values()}


def record_type(record_or_cls: Any) -> RecordType:
    """The registry entry of a record (or record class)."""
    cls = record_or_cls if isinstance(record_or_cls, type) else type(record_or_cls)
    try:
        return _BY_CLS[cls]
    except KeyError:
        known = sorted(REGISTRY)
        raise SchemaError(f"{cls.__name__} is not a record type; use one of {known}") from None


@cache
def schema_for(name: str, version: int) -> pa.Schema:
    """The Arrow schema of record ``name`` at ``version``: current, or frozen in ``frozen/``."""
    rtype = REGISTRY.get(name)
    if rtype is None:
        raise SchemaError(f"unknown record type {name!r}; known: {sorted(REGISTRY)}")
    if version == rtype.version:
        return rtype.schema
    path = FROZEN_DIR / f"{name}-v{version}.arrow"
    if version > rtype.version or not path.exists():
        raise SchemaError(
            f"{name} schema version {version} is unknown to this reader (it knows up to "
            f"{rtype.version}); upgrade openforge to read records from a newer writer."
        )
    return pa.ipc.read_schema(pa.py_buffer(path.read_bytes()))


# --- record <-> row (plain Python values in Arrow's shape) ---------------------------------------


_FIELD_NAMES: dict[type[Any], tuple[str, ...] | None] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...] | None:
    """A dataclass's field names (None for any other type): looked up once per type."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = None
        if dataclasses.is_dataclass(cls):
            names = tuple(f.name for f in dataclasses.fields(cls))
        _FIELD_NAMES[cls] = names
        return names


def to_row(value: Any) -> Any:
    """A record as a dict of plain values in Arrow's shape (what ``pa.array`` of its struct
    type and ``pa.RecordBatch.from_pylist`` accept)."""
    names = _field_names(type(value))
    if names is not None:
        return {name: to_row(getattr(value, name)) for name in names}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return [(k, to_row(v)) for k, v in value.items()]
    if isinstance(value, list):
        # Token ids and logprobs: homogeneous lists of scalars pass through as they are.
        first = value[0] if value else None
        if first is None or (isinstance(first, int | float | str) and not isinstance(first, Enum)):
            return value
        return [to_row(v) for v in value]
    return value


def _identity(value: Any) -> Any:
    return value


@cache
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """A function turning an Arrow ``to_pylist`` value into a value of type ``hint``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        dec = _decoder(inner[0]) if len(inner) == 1 else _identity
        return lambda v: None if v is None else dec(v)
    if origin is list:
        item = _decoder(args[0])
        if item is _identity:
            return list
        return lambda v: [item(x) for x in v]
    if origin is dict:
        val = _decoder(args[1])
        return lambda v: {k: val(x) for k, x in (v.items() if isinstance(v, dict) else v)}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: from_row(hint, v)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    return _identity


_FIELD_DECODERS: dict[type[Any], tuple[tuple[str, Callable[[Any], Any]], ...]] = {}


def _field_decoders(cls: type[Any]) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    decoders = _FIELD_DECODERS.get(cls)
    if decoders is None:
        hints = typing.get_type_hints(cls)
        decoders = tuple((f.name, _decoder(hints[f.name])) for f in dataclasses.fields(cls))
        _FIELD_DECODERS[cls] = decoders
    return decoders


def from_row(cls: type[T], row: dict[str, Any]) -> T:
    """Rebuild a record (or nested dataclass) from a row; absent fields take their defaults."""
    kwargs = {name: dec(row[name]) for name, dec in _field_decoders(cls) if name in row}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise SchemaError(f"cannot build {cls.__name__} from row: {exc}") from exc


# --- batches ------------------------------------------------------------------------------------


def encode_batch(records: Sequence[R]) -> pa.RecordBatch:
    """Records of one type as an Arrow record batch of the current schema."""
    if not records:
        raise SchemaError("encode_batch needs at least one record")
    rtype = record_type(records[0])
    try:
        rows = [to_row(r) for r in records]
        for row in rows:  # a record is written in the current version, whatever it was read as
            row["schema_version"] = rtype.version
        # One conversion of the rows as a struct array, not one per column (from_pylist): the
        # same batch, about half the CPU (bench/codec_encode.py).
        schema, struct = _batch_types(rtype.name)
        batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=struct))
        return batch.replace_schema_metadata(schema.metadata)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise SchemaError(f"{rtype.name} record does not fit its schema: {exc}") from exc


@cache
def _batch_types(name: str) -> tuple[pa.Schema, pa.StructType]:
    """A record type's current schema with its metadata, and the struct type of its rows."""
    schema = REGISTRY[name].schema_with_metadata()
    return schema, pa.struct(list(schema))


def decode_batch(cls: type[R], batch: pa.RecordBatch | pa.Table) -> list[R]:
    """Records from a batch of the current or any older version of ``cls``'s schema."""
    rtype = record_type(cls)
    meta = batch.schema.metadata or {}
    version = int(meta.get(b"openforge.version", str(rtype.version).encode()))
    if version > rtype.version:
        schema_for(rtype.name, version)  # raises the upgrade message
    return [from_row(cls, row) for row in batch.to_pylist()]


# --- Kafka / local-log frames -------------------------------------------------------------------


def encode_message(records: Sequence[Record], compress: bool = False) -> bytes:
    """One frame holding ``records`` (all of one type); ``compress`` zstd-compresses the body."""
    batch = encode_batch(records)  # type: ignore[type-var]
    rtype = record_type(records[0])
    body = batch.serialize()
    codec = CODEC_ZSTD if compress else CODEC_NONE
    header = _HEADER.pack(_MAGIC, _FRAME_VERSION, rtype.type_id, codec, rtype.version)
    if compress:
        header += struct.pack(">Q", body.size)
        body = pa.compress(body, codec="zstd", asbytes=False)
    return header + bytes(body.to_pybytes())


def peek_type(frame: bytes) -> RecordType:
    """The record type a frame holds, without decoding it."""
    return _parse_header(frame)[0]


_U32, _I32, _U16, _I64 = (
    struct.Struct("<I"),
    struct.Struct("<i"),
    struct.Struct("<H"),
    struct.Struct("<q"),
)
_IPC_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH_HEADER = 3  # Arrow's MessageHeader union: Schema 1, DictionaryBatch 2, RecordBatch 3


def _table_field(buf: memoryview, table: int, index: int) -> int | None:
    """Position of field ``index`` of the flatbuffer table at ``table``, or None if absent."""
    vtable = table - _I32.unpack_from(buf, table)[0]
    if 4 + 2 * index >= _U16.unpack_from(buf, vtable)[0]:
        return None
    offset = _U16.unpack_from(buf, vtable + 4 + 2 * index)[0]
    return table + offset if offset else None


def peek_rows(frame: bytes) -> int:
    """How many records a frame holds, from its header and the Arrow message's metadata (the
    ``length`` of its RecordBatch flatbuffer), without decoding the body: a few microseconds
    where :func:`decode_message` takes hundreds for a completion event. A compressed body is
    decompressed first. Raises :class:`SchemaError` where the frame is not well-formed."""
    rtype, codec, _ = _parse_header(frame)
    body: Any = memoryview(frame)[_HEADER.size :]
    try:
        if codec == CODEC_ZSTD:
            (size,) = struct.unpack_from(">Q", body)
            if size > MAX_FRAME_BODY:
                raise SchemaError(f"frame claims a {size}-byte body (limit {MAX_FRAME_BODY})")
            body = memoryview(pa.decompress(body[8:], decompressed_size=size, codec="zstd"))
        elif codec != CODEC_NONE:
            raise SchemaError(f"frame codec {codec} is unknown; upgrade openforge")
        start = 8 if _U32.unpack_from(body)[0] == _IPC_CONTINUATION else 4
        meta = body[start : start + _I32.unpack_from(body, start - 4)[0]]
        message = _U32.unpack_from(meta)[0]  # the root table: Arrow's Message
        header_type = _table_field(meta, message, 1)
        header = _table_field(meta, message, 2)
        if header_type is None or meta[header_type] != _RECORD_BATCH_HEADER or header is None:
            raise SchemaError(f"corrupt {rtype.name} frame: its body is not a record batch")
        batch = header + _U32.unpack_from(meta, header)[0]
        length = _table_field(meta, batch, 0)  # RecordBatch.length: the number of rows
        return _I64.unpack_from(meta, length)[0] if length is not None else 0
    except (pa.ArrowInvalid, OSError, OverflowError, struct.error, IndexError) as exc:
        raise SchemaError(f"corrupt {rtype.name} frame: {exc}") from exc


def _parse_header(frame: bytes) -> tuple[RecordType, int, int]:
    if len(frame) < _HEADER.size:
        raise SchemaError(f"frame of {len(frame)} bytes is shorter than its header")
    magic, frame_version, type_id, codec, version = _HEADER.unpack_from(frame)
    if magic != _MAGIC:
        raise SchemaError("not an OpenForge frame (bad magic): is another tool writing here?")
    if frame_version != _FRAME_VERSION:
        raise SchemaError(f"frame version {frame_version} is unknown; upgrade openforge")
    rtype = _BY_ID.get(type_id)
    if rtype is None:
        raise SchemaError(f"record type id {type_id} is unknown; upgrade openforge")
    return rtype, codec, version


def decode_message(frame: bytes) -> list[Record]:
    """The records of one frame, of whatever type and (older or current) version it holds."""
    rtype, codec, version = _parse_header(frame)
    schema = schema_for(rtype.name, version)
    body: Any = memoryview(frame)[_HEADER.size :]
    if codec not in (CODEC_NONE, CODEC_ZSTD):
        raise SchemaError(f"frame codec {codec} is unknown; upgrade openforge")
    try:
        if codec == CODEC_ZSTD:
            (size,) = struct.unpack_from(">Q", body)
            if size > MAX_FRAME_BODY:
                raise SchemaError(f"frame claims a {size}-byte body (limit {MAX_FRAME_BODY})")
            body = pa.decompress(body[8:], decompressed_size=size, codec="zstd")
        batch = pa.ipc.read_record_batch(pa.py_buffer(body), schema)
        # A damaged body can carry lengths and offsets that read past its buffers: Arrow aborts
        # the process on those (not an exception), so they are checked before any row is read.
        batch.validate(full=True)
    except (pa.ArrowInvalid, OSError, OverflowError, struct.error) as exc:
        raise SchemaError(f"corrupt {rtype.name} frame: {exc}") from exc
    return [from_row(rtype.cls, row) for row in batch.to_pylist()]


def decode_messages(frames: Iterable[bytes]) -> list[Record]:
    return [r for f in frames for r in decode_message(f)]
