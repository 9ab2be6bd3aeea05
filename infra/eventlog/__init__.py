"""The event log boundary: append frames keyed by rollout id, read them back in order.

Two implementations behind one interface: Apache Kafka (``kafka://HOST:PORT[,HOST:PORT]``) and
an embedded local log on disk (``local:DIR``) for one machine without a broker.
"""

from __future__ import annotations

from infra.eventlog.base import (
    DEAD_LETTER_TOPIC,
    EPISODES_TOPIC,
    EVENTS_TOPIC,
    EventLogReader,
    EventLogWriter,
    LogRecord,
    open_reader,
    open_writer,
)

__all__ = [
    "DEAD_LETTER_TOPIC",
    "EPISODES_TOPIC",
    "EVENTS_TOPIC",
    "EventLogReader",
    "EventLogWriter",
    "LogRecord",
    "open_reader",
    "open_writer",
]
