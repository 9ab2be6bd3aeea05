"""Open an event log writer or reader from its URL (see :mod:`infra.eventlog.urls`).

The implementations are imported on first use, so a process on the local log never imports
the Kafka client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from infra.eventlog.base import EventLogReader, EventLogWriter
from infra.eventlog.urls import LogKind, LogUrl, parse_url
from schemas.codec import Record, decode_message
from schemas.errors import ConfigError, EventLogError


def _log_url(url: str) -> LogUrl:
    parsed = parse_url(url)
    if parsed.kind is LogKind.ARCHIVE:
        raise ConfigError(
            f"{url!r} is a Parquet archive, not an event log: use kafka://HOST:PORT or local:DIR "
            "(archives are read with schemas.archive.read_archive)"
        )
    return parsed


def open_writer(url: str, fsync: bool = True, **options: object) -> EventLogWriter:
    """A writer; ``options`` go to the Kafka producer (the local log takes none). ``fsync``:
    the local log's ``flush`` syncs to disk (False: it hands the records to the OS, so they
    survive the writer's crash but not the machine's; Kafka's durability is the broker's ack)."""
    parsed = _log_url(url)
    if parsed.kind is LogKind.KAFKA:
        from infra.eventlog.kafka import KafkaWriter

        return KafkaWriter(parsed.where, **options)
    from infra.eventlog.local import LocalLog

    return LocalLog(parsed.path).writer(fsync=fsync)


def create_topics(url: str, topics: Sequence[str], timeout_s: float | None = None) -> None:
    """Make sure ``topics`` exist: on Kafka, those missing are created (a reader started before
    the first write then finds its topic); the local log needs nothing. ``timeout_s``: give up
    on a broker that does not answer after about this long (default: Kafka's 30 s)."""
    parsed = _log_url(url)
    if parsed.kind is LogKind.KAFKA:
        from infra.eventlog.kafka import ensure_topics

        limits = {} if timeout_s is None else {
            "bootstrap_timeout_ms": int(timeout_s * 1000),
            "request_timeout_ms": int(timeout_s * 2000),
        }  # fmt: skip
        ensure_topics(parsed.where, list(topics), partitions=parsed.partitions, **limits)


def message_limit(url: str) -> int | None:
    """The largest value a writer of ``url`` takes (None: no limit of its own), known before
    one is opened, so a caller can refuse an over-size record when it is asked to make one."""
    if _log_url(url).kind is LogKind.KAFKA:
        from infra.eventlog.kafka import MAX_MESSAGE_BYTES

        return MAX_MESSAGE_BYTES
    return None


def open_reader(
    url: str,
    topics: Sequence[str] = (),
    group: str | None = None,
    from_beginning: bool = True,
    **options: object,
) -> EventLogReader:
    """A reader. With ``group``, a member of that consumer group on ``topics`` (``poll`` and
    ``commit``; a new group starts at the beginning, or at the end if not ``from_beginning``).
    Without, a reader of partitions only (``partitions``, ``end_offset``, ``read``). On Kafka,
    ``topics`` missing are created first, with the URL's ``partitions``.
    ``options`` go to the Kafka consumers (the local log takes none)."""
    if topics and group is None:
        raise ConfigError(
            f"reading topics {list(topics)} needs a consumer group: pass group=NAME "
            "(or no topics, to read partitions by offset)"
        )
    parsed = _log_url(url)
    if parsed.kind is LogKind.KAFKA:
        from infra.eventlog.kafka import KafkaReader

        return KafkaReader(
            parsed.where,
            list(topics),
            group,
            from_beginning=from_beginning,
            partitions=parsed.partitions,
            **options,
        )
    from infra.eventlog.local import LocalLog

    return LocalLog(parsed.path).reader(list(topics), group, from_beginning=from_beginning)


def records_in(url: str, topic: str) -> Iterator[Record]:
    """Every record in ``topic`` of the event log at ``url``, partition by partition in log
    order (none if the topic does not exist yet); reads by offset, moving no consumer group.
    Records repeat where the log holds a message twice (at-least-once writers)."""
    with open_reader(url) as reader:
        try:
            partitions = reader.partitions(topic, timeout=2.0)
        except EventLogError:
            return  # not created yet: nothing written
        for partition in partitions:
            offset, end = 0, reader.end_offset(topic, partition)
            while offset < end:
                batch = reader.read(topic, partition, offset, 1000, timeout=1.0)
                for message in batch.records:
                    yield from decode_message(message.value)
                offset = batch.next_offset
