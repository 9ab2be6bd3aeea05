"""The Apache Kafka event log (kafka-python): idempotent, ``acks=all`` producer; group consumer;
partition reads by offset with a second, group-less consumer (a consumer cannot both subscribe
and assign).

Every kafka-python error is translated: a damaged record or an offset outside the partition
(:class:`CorruptRecordError`, :class:`OffsetOutOfRangeError`, a record over the size limit) into
:class:`EventLogCorrupt`; everything else (no broker, timeouts, rebalances...) into
:class:`EventLogUnavailable`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    CorruptRecordError,
    KafkaError,
    MessageSizeTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
)
from kafka.structs import OffsetAndMetadata

from infra.eventlog.base import EventLogReader, EventLogWriter, LogRecord, PartitionBatch
from schemas.errors import ConfigError, EventLogCorrupt, EventLogError, EventLogUnavailable

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_CORRUPT = (
    CorruptRecordError,
    OffsetOutOfRangeError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)


def translate(exc: BaseException, what: str) -> EventLogError:
    """Our error for a kafka-python (or socket) error that happened while doing ``what``."""
    if isinstance(exc, _CORRUPT):
        return EventLogCorrupt(f"{what}: {exc!r}; this record cannot be used as it is")
    return EventLogUnavailable(f"{what}: {exc!r}; check that the broker is up and retry")


@contextlib.contextmanager
def _kafka_errors(what: str) -> Iterator[None]:
    try:
        yield
    except (KafkaError, OSError) as exc:
        raise translate(exc, what) from exc


def ensure_topics(
    bootstrap: str, topics: list[str], partitions: int = 1, replication: int = 1, **options: Any
) -> None:
    """Create the topics that do not exist yet (for clusters without topic auto-creation);
    ``options`` go to the admin client."""
    with _kafka_errors(f"cannot create topics {topics} on Kafka at {bootstrap}"):
        create_missing(bootstrap, topics, partitions, replication, **options)


def create_missing(
    bootstrap: str, topics: list[str], partitions: int = 1, replication: int = 1, **options: Any
) -> None:
    """:func:`ensure_topics` raising Kafka's own errors (for callers that word them)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **options)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(t, partitions, replication) for t in topics if t not in existing]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
    finally:
        admin.close()


class KafkaWriter(EventLogWriter):
    max_message_bytes = MAX_MESSAGE_BYTES

    def __init__(self, bootstrap: str, **options: Any) -> None:
        config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_block_ms=5_000,
            bootstrap_timeout_ms=5_000,  # the default 30 s would outlast a call's record_timeout
            request_timeout_ms=10_000,
            max_request_size=MAX_MESSAGE_BYTES,
        )
        config.update(options)
        with _kafka_errors(f"cannot connect a producer to Kafka at {bootstrap}"):
            self._producer = KafkaProducer(**config)
        self.bootstrap = bootstrap
        self._pending: list[Any] = []

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        with _kafka_errors(f"Kafka at {self.bootstrap} refused a record"):
            self._pending.append(self._producer.send(topic, key=key, value=value))

    def flush(self, timeout: float = 30.0) -> None:
        with _kafka_errors(f"Kafka at {self.bootstrap} did not confirm records"):
            self._producer.flush(timeout=timeout)
        pending, self._pending = self._pending, []
        failed = [f for f in pending if not f.succeeded()]
        if failed:
            self._pending = failed  # still unconfirmed: the caller retries or spools them
            raise translate(
                failed[0].exception,
                f"Kafka at {self.bootstrap} did not confirm {len(failed)} records",
            )

    def close(self) -> None:
        with contextlib.suppress(KafkaError, OSError):
            self._producer.close(timeout=10)


class KafkaReader(EventLogReader):
    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        group: str | None,
        from_beginning: bool = True,
        partitions: int = 1,
        **options: Any,
    ) -> None:
        self.bootstrap = bootstrap
        self._options = options  # for both consumers, over the defaults below
        self._group: Any = None
        self._direct: Any = None  # the group-less consumer of partition reads, made on first use
        if group is None:
            return
        with _kafka_errors(f"cannot connect a consumer to Kafka at {bootstrap}"):
            # Missing topics first, with their partitions: subscribed to first, the broker
            # would create one with a single partition.
            admin = {k: v for k, v in options.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
            create_missing(bootstrap, topics, partitions, **admin)
            self._group = KafkaConsumer(
                *topics,
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest" if from_beginning else "latest",
                fetch_max_bytes=64 * 1024 * 1024,
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
                **options,
            )

    # --- consumer group -----------------------------------------------------------------------

    def _member(self) -> Any:
        if self._group is None:
            raise ConfigError("this reader has no consumer group: open it with group=NAME to poll")
        return self._group

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        consumer = self._member()
        with _kafka_errors(f"Kafka poll from {self.bootstrap} failed"):
            batches = consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        out = [
            LogRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
            for records in batches.values()
            for r in records
        ]
        out.sort(key=lambda r: (r.topic, r.partition, r.offset))
        return out

    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        consumer = self._member()
        with _kafka_errors(f"Kafka commit to {self.bootstrap} failed"):
            if positions:
                consumer.commit(
                    {
                        TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                        for (t, p), o in positions.items()
                    }
                )
                return
            consumer.commit()

    # --- partitions ---------------------------------------------------------------------------

    def _consumer(self) -> Any:
        if self._direct is None:
            with _kafka_errors(f"cannot connect a consumer to Kafka at {self.bootstrap}"):
                self._direct = KafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    enable_auto_commit=False,
                    auto_offset_reset="none",  # an offset out of range raises, never skips
                    max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
                    **self._options,
                )
        return self._direct

    def partitions(self, topic: str, timeout: float = 30.0) -> list[int]:
        consumer = self._consumer()
        with _kafka_errors(f"cannot list the partitions of {topic!r} on {self.bootstrap}"):
            deadline = time.monotonic() + timeout
            while True:
                found = consumer.partitions_for_topic(topic)
                if found:
                    return sorted(found)
                if time.monotonic() >= deadline:
                    break
                consumer.topics()  # refresh metadata
                time.sleep(0.5)
        raise EventLogUnavailable(
            f"topic {topic!r} not found on {self.bootstrap}: has the proxy published yet?"
        )

    def end_offset(self, topic: str, partition: int) -> int:
        tp = TopicPartition(topic, partition)
        with _kafka_errors(
            f"cannot read the end offset of {topic}/{partition} on {self.bootstrap}"
        ):
            return int(self._consumer().end_offsets([tp]).get(tp, 0))

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        timeout: float = 1.0,
    ) -> PartitionBatch:
        consumer = self._consumer()
        tp = TopicPartition(topic, partition)
        end = self.end_offset(topic, partition)
        if offset < 0 or offset > end:
            raise EventLogCorrupt(
                f"offset {offset} is outside {topic}/{partition} on {self.bootstrap}, which ends "
                f"at {end}: read from an offset up to end_offset()"
            )
        where = f"Kafka read of {topic}/{partition} from offset {offset} on {self.bootstrap}"
        with _kafka_errors(where):
            if consumer.assignment() != {tp}:
                consumer.assign([tp])
            consumer.seek(tp, offset)
            batches = consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        records = tuple(
            LogRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
            for r in batches.get(tp, [])
        )
        next_offset = records[-1].offset + 1 if records else offset
        return PartitionBatch(records, next_offset, max(end, next_offset))

    def close(self) -> None:
        with _kafka_errors(f"closing the Kafka consumers of {self.bootstrap} failed"):
            for consumer in (self._group, self._direct):
                if consumer is not None:
                    consumer.close()
