"""The embedded local log: append-only files on disk with offsets and group positions.

Layout::

    ROOT/<topic>/data.log              entries (see infra.eventlog.local_format), appended under
                                       an exclusive flock
    ROOT/<topic>/groups/<group>.json   {"offset": N, "position": BYTES} of each consumer group

Each topic has one partition, 0. Positions are record offsets, as on Kafka: a group's file keeps
the byte position next to its offset, and partition reads find an offset's byte position with
an in-memory sparse index (see infra.eventlog.local_index). Several processes may append to and
read one log. Disk errors raise EventLogUnavailable, damaged entries EventLogCorrupt.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import BinaryIO

from infra.eventlog.base import EventLogReader, EventLogWriter, LogRecord, PartitionBatch
from infra.eventlog.local_format import DATA, disk_errors, pack, read_entries, skip
from infra.eventlog.local_index import OffsetIndex
from schemas.errors import ConfigError, EventLogCorrupt, EventLogError

_WAIT_S = 0.02  # between looks at the file while waiting for records


def _topic_dir(root: Path, topic: str) -> Path:
    if not topic or "/" in topic or topic.startswith("."):
        raise EventLogError(f"invalid topic name {topic!r}: use a non-empty name without '/'")
    return root / topic


class LocalLog:
    """A local log rooted at a directory (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        with disk_errors(f"create the local log directory {self.root}"):
            self.root.mkdir(parents=True, exist_ok=True)

    def writer(self, fsync: bool = True) -> LocalWriter:
        """A writer whose ``flush`` syncs to disk (``fsync=False``: hands the records to the OS)."""
        return LocalWriter(self.root, fsync)

    def reader(
        self, topics: list[str], group: str | None, from_beginning: bool = True
    ) -> LocalReader:
        return LocalReader(self.root, topics, group, from_beginning)

    def end_offset(self, topic: str) -> int:
        """The offset the next appended record of ``topic`` will get."""
        return _end(self.root, topic)[0]


def _end(root: Path, topic: str) -> tuple[int, int]:
    """(offset, byte position) after the last complete entry of ``topic``."""
    path = _topic_dir(root, topic) / DATA
    with disk_errors(f"read local log {path}"):
        if not path.exists():
            return 0, 0
        with open(path, "rb") as f:
            return skip(f, 0, 0)


class LocalWriter(EventLogWriter):
    def __init__(self, root: Path, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync
        self._files: dict[str, BinaryIO] = {}
        self._ends: dict[str, tuple[int, int]] = {}  # topic -> (next offset, byte position)

    def _file(self, topic: str) -> BinaryIO:
        f = self._files.get(topic)
        if f is None:
            directory = _topic_dir(self.root, topic)
            directory.mkdir(parents=True, exist_ok=True)
            f = open(directory / DATA, "a+b")  # noqa: SIM115 - closed in close()
            self._files[topic] = f
            self._ends[topic] = (0, 0)
        return f

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        with disk_errors(f"append to local log {self.root}/{topic}"):
            f = self._file(topic)
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                offset, position = self._ends[topic]
                if os.fstat(f.fileno()).st_size != position:  # another process appended
                    offset, position = skip(f, offset, position)
                entry = pack(offset, key, value, int(time.time() * 1000))
                f.seek(0, os.SEEK_END)
                f.write(entry)
                f.flush()
                self._ends[topic] = (offset + 1, position + len(entry))
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def flush(self, timeout: float = 30.0) -> None:
        for topic, f in self._files.items():
            with disk_errors(f"flush local log {self.root}/{topic}"):
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())

    def close(self) -> None:
        if self._files:
            self.flush()
        with disk_errors(f"close local log {self.root}"):
            for f in self._files.values():
                f.close()
        self._files.clear()


class LocalReader(EventLogReader):
    def __init__(
        self, root: Path, topics: list[str], group: str | None, from_beginning: bool
    ) -> None:
        if group is not None and (not group or "/" in group):
            raise EventLogError(f"invalid consumer group name {group!r}: use a name without '/'")
        self.root = root
        self.group = group
        self.topics = list(topics)
        self._positions: dict[str, tuple[int, int]] = {}
        self._files: dict[str, BinaryIO] = {}
        self._indexes: dict[str, OffsetIndex] = {}
        for topic in self.topics:
            stored = self._group_file(topic)
            with disk_errors(f"read the position of group {group!r} in {stored}"):
                text = stored.read_text() if stored.exists() else None
            if text is not None:
                try:
                    data = json.loads(text)
                    self._positions[topic] = (int(data["offset"]), int(data["position"]))
                except (ValueError, KeyError, TypeError) as exc:
                    raise EventLogCorrupt(
                        f"the position file {stored} is damaged ({exc}); delete it to start "
                        "the group again from the beginning"
                    ) from exc
            elif from_beginning:
                self._positions[topic] = (0, 0)
            else:
                self._positions[topic] = _end(root, topic)
        self._committed = dict(self._positions)
        self._starts: dict[str, dict[int, int]] = {}  # offsets polled since the last commit

    def _group_file(self, topic: str) -> Path:
        return _topic_dir(self.root, topic) / "groups" / f"{self.group}.json"

    def _file(self, topic: str) -> BinaryIO | None:
        f = self._files.get(topic)
        if f is None:
            path = _topic_dir(self.root, topic) / DATA
            with disk_errors(f"open local log {path}"):
                if not path.exists():
                    return None
                f = open(path, "rb")  # noqa: SIM115 - closed in close()
            self._files[topic] = f
        return f

    # --- consumer group -----------------------------------------------------------------------

    def _need_group(self) -> None:
        if self.group is None:
            raise ConfigError("this reader has no consumer group: open it with group=NAME to poll")

    def _read_topic(self, topic: str, limit: int) -> list[LogRecord]:
        f = self._file(topic)
        if f is None:
            return []
        offset, position = self._positions[topic]
        with disk_errors(f"read local log {self.root}/{topic}"):
            entries, _ = read_entries(f, position, limit, expect_offset=offset)
        starts = self._starts.setdefault(topic, {})
        for entry in entries:
            starts[entry.offset] = entry.start
        if entries:
            self._positions[topic] = (entries[-1].offset + 1, entries[-1].end)
        return [LogRecord(topic, 0, e.offset, e.key, e.value, e.timestamp_ms) for e in entries]

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        self._need_group()
        deadline = time.monotonic() + timeout
        while True:
            out: list[LogRecord] = []
            for topic in self.topics:
                out += self._read_topic(topic, max_records - len(out))
                if len(out) >= max_records:
                    break
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(_WAIT_S)

    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        self._need_group()
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
            with disk_errors(f"store the position of group {self.group!r} in {path}"):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps({"offset": offset, "position": position}))
                os.replace(tmp, path)
            self._committed[topic] = (offset, position)

    # --- partitions ---------------------------------------------------------------------------

    def partitions(self, topic: str, timeout: float = 30.0) -> list[int]:
        _topic_dir(self.root, topic)
        return [0]

    def _index(self, topic: str, partition: int) -> tuple[BinaryIO | None, OffsetIndex]:
        if partition != 0:
            raise EventLogError(
                f"the local log has one partition per topic, 0, not {partition}: "
                "list them with partitions()"
            )
        f = self._file(topic)
        return f, self._indexes.setdefault(topic, OffsetIndex())

    def end_offset(self, topic: str, partition: int) -> int:
        f, index = self._index(topic, partition)
        if f is None:
            return 0
        with disk_errors(f"read local log {self.root}/{topic}"):
            return index.extend(f)[0]

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        timeout: float = 1.0,
    ) -> PartitionBatch:
        deadline = time.monotonic() + timeout
        while True:
            f, index = self._index(topic, partition)
            if f is None:
                if offset != 0:
                    raise EventLogCorrupt(
                        f"offset {offset} is outside {self.root}/{topic}, which is empty: "
                        "read from offset 0"
                    )
                end = 0
            else:
                with disk_errors(f"read local log {self.root}/{topic}"):
                    start = index.locate(f, offset)
                    entries, at_end = read_entries(f, start, max_records, expect_offset=offset)
                    after = (
                        (entries[-1].offset + 1, entries[-1].end) if entries else (offset, start)
                    )
                    index.read(entries, *after)
                    end = after[0] if at_end else index.extend(f)[0]
                if entries:
                    records = tuple(
                        LogRecord(topic, 0, e.offset, e.key, e.value, e.timestamp_ms)
                        for e in entries
                    )
                    return PartitionBatch(records, after[0], end)
            if time.monotonic() >= deadline:
                return PartitionBatch((), offset, max(end, offset))
            time.sleep(_WAIT_S)

    def close(self) -> None:
        with disk_errors(f"close local log {self.root}"):
            for f in self._files.values():
                f.close()
        self._files.clear()
