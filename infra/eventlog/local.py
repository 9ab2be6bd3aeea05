"""The embedded local event log: append-only files on disk with offsets and group positions.

Layout::

    ROOT/<topic>/data.log              entries, appended under an exclusive flock
    ROOT/<topic>/groups/<group>.json   {"offset": N, "position": BYTES} of each consumer group

Entry = header ``>IIQQi`` (payload length, crc32 of payload, offset, timestamp ms, key length or -1)
followed by key and value. A reader stops at an incomplete tail (a writer mid-append) and refuses a
corrupt entry with its offset. Several processes may append to and read one log.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from infra.eventlog.base import EventLogReader, EventLogWriter, LogRecord
from schemas.errors import EventLogError

_HEADER = struct.Struct(">IIQQi")
_DATA = "data.log"


def _topic_dir(root: Path, topic: str) -> Path:
    if not topic or "/" in topic or topic.startswith("."):
        raise EventLogError(f"invalid topic name {topic!r}")
    return root / topic


@dataclass(frozen=True, slots=True)
class Entry:
    """One complete entry of a local-log file; ``end`` is the byte after it."""

    offset: int
    start: int
    end: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


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
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return out, True
        length, crc, offset, ts_ms, key_len = _HEADER.unpack(header)
        payload = f.read(length)
        if len(payload) < length:
            return out, True  # a writer is mid-append; read it next time
        expected = None if expect_offset is None else expect_offset + len(out)
        if zlib.crc32(payload) != crc or (expected is not None and offset != expected):
            where = f"offset {expected if expected is not None else offset} (byte {position})"
            raise EventLogError(
                f"local log {getattr(f, 'name', '?')} is corrupt at {where}; move the damaged "
                "file aside and replay from the archive"
            )
        end = position + _HEADER.size + length
        key = None if key_len < 0 else payload[:key_len]
        out.append(Entry(offset, position, end, key, payload[max(key_len, 0) :], ts_ms))
        position = end
    return out, False


class LocalLog:
    """A local log rooted at a directory (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def writer(self) -> LocalWriter:
        return LocalWriter(self.root)

    def reader(self, topics: list[str], group: str, from_beginning: bool = True) -> LocalReader:
        return LocalReader(self.root, topics, group, from_beginning)

    def end_offset(self, topic: str) -> int:
        """The offset the next appended record of ``topic`` will get."""
        path = _topic_dir(self.root, topic) / _DATA
        if not path.exists():
            return 0
        with open(path, "rb") as f:
            return _scan(f, 0, 0)[0]


def _scan(f: BinaryIO, offset: int, position: int) -> tuple[int, int]:
    """From (offset, position), skip every complete entry; returns the (offset, position) after."""
    f.seek(position)
    while True:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return offset, position
        length = _HEADER.unpack(header)[0]
        f.seek(length, os.SEEK_CUR)
        if f.tell() > os.fstat(f.fileno()).st_size:
            return offset, position
        offset += 1
        position += _HEADER.size + length


class LocalWriter(EventLogWriter):
    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, BinaryIO] = {}
        self._ends: dict[str, tuple[int, int]] = {}  # topic -> (next offset, byte position)

    def _file(self, topic: str) -> BinaryIO:
        f = self._files.get(topic)
        if f is None:
            directory = _topic_dir(self.root, topic)
            directory.mkdir(parents=True, exist_ok=True)
            f = open(directory / _DATA, "a+b")  # noqa: SIM115 - closed in close()
            self._files[topic] = f
            self._ends[topic] = (0, 0)
        return f

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        f = self._file(topic)
        payload = (key or b"") + value
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                offset, position = self._ends[topic]
                size = os.fstat(f.fileno()).st_size
                if size != position:  # another process appended since: catch up
                    offset, position = _scan(f, offset, position)
                header = _HEADER.pack(
                    len(payload),
                    zlib.crc32(payload),
                    offset,
                    int(time.time() * 1000),
                    -1 if key is None else len(key),
                )
                f.seek(0, os.SEEK_END)
                f.write(header + payload)
                f.flush()
                self._ends[topic] = (offset + 1, position + len(header) + len(payload))
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        except OSError as exc:
            raise EventLogError(f"cannot append to local log {self.root}/{topic}: {exc}") from exc

    def flush(self, timeout: float = 30.0) -> None:
        for topic, f in self._files.items():
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                raise EventLogError(f"cannot flush local log {self.root}/{topic}: {exc}") from exc

    def close(self) -> None:
        if self._files:
            self.flush()
        for f in self._files.values():
            f.close()
        self._files.clear()


class LocalReader(EventLogReader):
    def __init__(self, root: Path, topics: list[str], group: str, from_beginning: bool) -> None:
        if not group or "/" in group:
            raise EventLogError(f"invalid consumer group name {group!r}")
        self.root = root
        self.group = group
        self.topics = list(topics)
        self._positions: dict[str, tuple[int, int]] = {}
        self._files: dict[str, BinaryIO] = {}
        for topic in self.topics:
            stored = self._group_file(topic)
            if stored.exists():
                data = json.loads(stored.read_text())
                self._positions[topic] = (int(data["offset"]), int(data["position"]))
            elif from_beginning:
                self._positions[topic] = (0, 0)
            else:
                self._positions[topic] = LocalLog(root).end_offset(topic), self._size(topic)
        self._committed = dict(self._positions)
        self._starts: dict[str, dict[int, int]] = {}  # offsets polled since the last commit

    def _group_file(self, topic: str) -> Path:
        return _topic_dir(self.root, topic) / "groups" / f"{self.group}.json"

    def _size(self, topic: str) -> int:
        path = _topic_dir(self.root, topic) / _DATA
        return path.stat().st_size if path.exists() else 0

    def _file(self, topic: str) -> BinaryIO | None:
        f = self._files.get(topic)
        if f is None:
            path = _topic_dir(self.root, topic) / _DATA
            if not path.exists():
                return None
            f = open(path, "rb")  # noqa: SIM115 - closed in close()
            self._files[topic] = f
        return f

    def _read_topic(self, topic: str, limit: int) -> list[LogRecord]:
        f = self._file(topic)
        if f is None:
            return []
        offset, position = self._positions[topic]
        entries, _ = read_entries(f, position, limit, expect_offset=offset)
        starts = self._starts.setdefault(topic, {})
        for entry in entries:
            starts[entry.offset] = entry.start
        if entries:
            self._positions[topic] = (entries[-1].offset + 1, entries[-1].end)
        return [LogRecord(topic, 0, e.offset, e.key, e.value, e.timestamp_ms) for e in entries]

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        deadline = time.monotonic() + timeout
        while True:
            out: list[LogRecord] = []
            for topic in self.topics:
                out += self._read_topic(topic, max_records - len(out))
                if len(out) >= max_records:
                    break
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(0.02)

    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        targets = dict(self._positions)
        for (topic, _partition), offset in (positions or {}).items():
            start = self._starts.get(topic, {}).get(offset)
            if start is None and offset != targets[topic][0]:
                raise EventLogError(
                    f"cannot commit offset {offset} of {topic}: it was not polled after the "
                    "committed position"
                )
            if start is not None:
                targets[topic] = (offset, start)
        for topic, (offset, _) in targets.items():  # forget starts below the new position
            starts = self._starts.get(topic, {})
            self._starts[topic] = {o: p for o, p in starts.items() if o >= offset}
        for topic, (offset, position) in targets.items():
            if self._committed.get(topic) == (offset, position):
                continue
            path = self._group_file(topic)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"offset": offset, "position": position}))
            os.replace(tmp, path)
            self._committed[topic] = (offset, position)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
