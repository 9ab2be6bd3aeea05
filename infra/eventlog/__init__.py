"""The event log boundary: append frames keyed by rollout id, read them back in order.

Two implementations behind one interface (:mod:`infra.eventlog.base`): Apache Kafka
(``kafka://HOST:PORT[,HOST:PORT]``) and an embedded local log on disk (``local:DIR``) for one
machine without a broker. :mod:`infra.eventlog.urls` parses the URLs (``archive:DIR`` too) and
:mod:`infra.eventlog.factory` opens a writer or reader for one.
"""

from __future__ import annotations

from infra.eventlog.base import (
    DEAD_LETTER_TOPIC,
    EPISODES_TOPIC,
    EVENTS_TOPIC,
    EventLogReader,
    EventLogWriter,
    LogRecord,
    PartitionBatch,
)
from infra.eventlog.factory import (
    create_topics,
    message_limit,
    open_reader,
    open_writer,
    records_in,
)
from infra.eventlog.urls import LogKind, LogUrl, parse_url

__all__ = [
    "DEAD_LETTER_TOPIC",
    "EPISODES_TOPIC",
    "EVENTS_TOPIC",
    "EventLogReader",
    "EventLogWriter",
    "LogKind",
    "LogRecord",
    "LogUrl",
    "PartitionBatch",
    "create_topics",
    "message_limit",
    "open_reader",
    "open_writer",
    "parse_url",
    "records_in",
]
