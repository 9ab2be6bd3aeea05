"""The local log's data file: its entry format, reading entries, and skipping over them.

Entry = header ``>IIQQi`` (payload length, crc32 of payload, offset, timestamp ms, key length or
-1) followed by key and value. Offsets are dense: the file's n-th entry has offset n. Reading
stops at an incomplete tail (a writer mid-append: read it next time) and refuses an entry whose
crc or offset is wrong with :class:`EventLogCorrupt`; disk errors become
:class:`EventLogUnavailable` (see :func:`disk_errors`).
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from schemas.errors import EventLogCorrupt, EventLogUnavailable

HEADER = struct.Struct(">IIQQi")
DATA = "data.log"


@dataclass(frozen=True, slots=True)
class Entry:
    """One complete entry of a local-log file; ``end`` is the byte after it."""

    offset: int
    start: int
    end: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


@contextlib.contextmanager
def disk_errors(what: str) -> Iterator[None]:
    """Translate an ``OSError`` while doing ``what`` into :class:`EventLogUnavailable`."""
    try:
        yield
    except OSError as exc:
        raise EventLogUnavailable(
            f"cannot {what}: {exc}; check the disk (space, permissions) and retry"
        ) from exc


def corrupt(f: BinaryIO, offset: int, position: int, why: str) -> EventLogCorrupt:
    return EventLogCorrupt(
        f"local log {getattr(f, 'name', '?')} is corrupt at offset {offset} (byte {position}): "
        f"{why}; move the damaged file aside and replay from the archive"
    )


def pack(offset: int, key: bytes | None, value: bytes, timestamp_ms: int) -> bytes:
    """One entry, header and payload."""
    payload = (key or b"") + value
    key_len = -1 if key is None else len(key)
    return HEADER.pack(len(payload), zlib.crc32(payload), offset, timestamp_ms, key_len) + payload


def read_entries(
    f: BinaryIO, start: int, limit: int, expect_offset: int | None = None
) -> tuple[list[Entry], bool]:
    """Up to ``limit`` complete entries from byte ``start``; True when the end of the written
    data (or a writer mid-append) was reached. Checks each entry's crc, and its offset when
    ``expect_offset`` gives the first one."""
    f.seek(start)
    out: list[Entry] = []
    position = start
    while len(out) < limit:
        header = f.read(HEADER.size)
        if len(header) < HEADER.size:
            return out, True
        length, crc, offset, ts_ms, key_len = HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) < length:
            return out, True  # a writer is mid-append; read it next time
        expected = offset if expect_offset is None else expect_offset + len(out)
        if zlib.crc32(payload) != crc:
            raise corrupt(f, expected, position, "crc mismatch")
        if offset != expected:
            raise corrupt(f, expected, position, f"the entry there says offset {offset}")
        end = position + HEADER.size + length
        key = None if key_len < 0 else payload[:key_len]
        out.append(Entry(offset, position, end, key, payload[max(key_len, 0) :], ts_ms))
        position = end
    return out, False


def skip(f: BinaryIO, offset: int, position: int, count: int | None = None) -> tuple[int, int]:
    """From entry ``offset`` at byte ``position``, skip up to ``count`` complete entries (all
    if None) reading headers only; returns the (offset, position) after them. Checks that
    each header carries the offset it should (crcs are checked when entries are read)."""
    size = os.fstat(f.fileno()).st_size
    stop = None if count is None else offset + count
    while stop is None or offset < stop:
        if position + HEADER.size > size:
            break
        f.seek(position)
        header = f.read(HEADER.size)
        if len(header) < HEADER.size:
            break
        length, _, found, _, _ = HEADER.unpack(header)
        if found != offset:
            raise corrupt(f, offset, position, f"the entry there says offset {found}")
        if position + HEADER.size + length > size:
            break  # a writer is mid-append
        offset += 1
        position += HEADER.size + length
    return offset, position
