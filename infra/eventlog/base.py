"""The event log interface: topic names, records, a writer and a reader.

Nothing here knows an implementation; :mod:`infra.eventlog.factory` opens one from a URL.
Positions are record offsets everywhere: the n-th record appended to a topic partition has
offset n (from 0), on Kafka and on the local log alike.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from types import TracebackType
from typing import Self

EVENTS_TOPIC = "openforge.events"  # completion, rollout and reward events, keyed by rollout id
EPISODES_TOPIC = "openforge.episodes"  # assembled episodes, keyed by rollout id
DEAD_LETTER_TOPIC = "openforge.deadletter"  # episodes that cannot be trained on, with the reason


@dataclass(frozen=True, slots=True)
class LogRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PartitionBatch:
    """What one :meth:`EventLogReader.read` of a partition returned.

    Attributes:
        records: in offset order; the first one is at the offset asked for.
        next_offset: where the next read continues: after the last record, or, if there was
            none, the offset asked for.
        end_offset: the partition's end when it was read (the offset the next appended record
            gets), at least ``next_offset``.
    """

    records: tuple[LogRecord, ...]
    next_offset: int
    end_offset: int

    @property
    def caught_up(self) -> bool:
        """True when nothing written before the read is left to read."""
        return self.next_offset >= self.end_offset


class _Closing(abc.ABC):
    """Closed on leaving a ``with`` block."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EventLogWriter(_Closing):
    """Appends records. ``append`` may buffer; after ``flush`` returns, everything is durable.

    Failures raise :class:`~schemas.errors.EventLogUnavailable` (retry later) or
    :class:`~schemas.errors.EventLogCorrupt` (the log cannot take this record).
    ``max_message_bytes`` is the largest value the log takes (None: no limit of its own)."""

    max_message_bytes: int | None = None

    @abc.abstractmethod
    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one record; raise an :class:`EventLogError` if the log cannot take it."""

    @abc.abstractmethod
    def flush(self, timeout: float = 30.0) -> None:
        """Block until every appended record is durable, or raise an :class:`EventLogError`."""


class EventLogReader(_Closing):
    """Reads records two ways.

    As a consumer group member (a reader opened with a group and topics): :meth:`poll` and
    :meth:`commit`; the group's positions survive restarts. By partition (any reader, for
    example a pipeline source that keeps its own positions): :meth:`partitions`,
    :meth:`end_offset` and :meth:`read`. Both ways raise
    :class:`~schemas.errors.EventLogUnavailable` on an outage and
    :class:`~schemas.errors.EventLogCorrupt` for a record that cannot be read.
    """

    @abc.abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        """Up to ``max_records`` records after the current position (waits up to ``timeout``)."""

    @abc.abstractmethod
    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        """Store this group's position: after the last polled record, or, per (topic,
        partition), the offset of the first record not yet done with (it is read again after a
        restart). Only offsets polled since the last commit may be given."""

    @abc.abstractmethod
    def partitions(self, topic: str, timeout: float = 30.0) -> list[int]:
        """The topic's partition numbers, sorted. Waits up to ``timeout`` for a topic that does
        not exist yet where the log needs it to (Kafka)."""

    @abc.abstractmethod
    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record appended to the partition will get (0 while empty)."""

    @abc.abstractmethod
    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        timeout: float = 1.0,
    ) -> PartitionBatch:
        """Up to ``max_records`` records of the partition, from the record at ``offset`` on;
        waits up to ``timeout`` for a first one. Does not move any group's position. An offset
        past the end (or no longer kept) raises :class:`~schemas.errors.EventLogCorrupt`."""
