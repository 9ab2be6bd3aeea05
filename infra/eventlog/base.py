"""The event log interface and URL parsing."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from schemas.errors import ConfigError

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
    """Appends records. ``append`` may buffer; after ``flush`` returns, everything is durable."""

    @abc.abstractmethod
    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one record; raise :class:`EventLogError` if the log cannot take it."""

    @abc.abstractmethod
    def flush(self, timeout: float = 30.0) -> None:
        """Block until every appended record is durable, or raise :class:`EventLogError`."""


class EventLogReader(_Closing):
    """Reads records of some topics as a consumer group member; positions survive restarts."""

    @abc.abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        """Up to ``max_records`` records after the current position (waits up to ``timeout``)."""

    @abc.abstractmethod
    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        """Store this group's position: after the last polled record, or, per (topic,
        partition), the offset of the first record not yet done with (it is read again after a
        restart). Only offsets polled since the last commit may be given."""


def parse_url(url: str) -> tuple[str, str]:
    """``kafka://HOST:PORT`` -> ("kafka", "HOST:PORT"); ``local:DIR`` -> ("local", DIR)."""
    if url.startswith("kafka://"):
        servers = url.removeprefix("kafka://").rstrip("/")
        if servers:
            return "kafka", servers
    elif url.startswith("local:"):
        path = url.removeprefix("local:")
        if path.startswith("//"):
            path = path[2:]
        if path:
            return "local", path
    raise ConfigError(
        f"unknown event log {url!r}: use kafka://HOST:PORT[,HOST:PORT...] or local:DIR"
    )


def open_writer(url: str, **options: object) -> EventLogWriter:
    kind, where = parse_url(url)
    if kind == "kafka":
        from infra.eventlog.kafka import KafkaWriter

        return KafkaWriter(where, **options)
    from infra.eventlog.local import LocalLog

    return LocalLog(Path(where)).writer()


def open_reader(
    url: str, topics: list[str], group: str, from_beginning: bool = True
) -> EventLogReader:
    kind, where = parse_url(url)
    if kind == "kafka":
        from infra.eventlog.kafka import KafkaReader

        return KafkaReader(where, topics, group, from_beginning=from_beginning)
    from infra.eventlog.local import LocalLog

    return LocalLog(Path(where)).reader(topics, group, from_beginning=from_beginning)
