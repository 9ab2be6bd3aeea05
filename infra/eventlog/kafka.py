"""The Apache Kafka event log (kafka-python): idempotent, ``acks=all`` producer; group consumer."""

from __future__ import annotations

import contextlib
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from infra.eventlog.base import EventLogReader, EventLogWriter, LogRecord
from schemas.errors import EventLogError

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def ensure_topics(
    bootstrap: str, topics: list[str], partitions: int = 1, replication: int = 1
) -> None:
    """Create the topics that do not exist yet (for clusters without topic auto-creation)."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    except KafkaError as exc:
        raise EventLogError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(t, partitions, replication) for t in topics if t not in existing]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
    finally:
        admin.close()


class KafkaWriter(EventLogWriter):
    def __init__(self, bootstrap: str, **options: Any) -> None:
        config: dict[str, Any] = dict(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            max_block_ms=5_000,
            request_timeout_ms=10_000,
            max_request_size=MAX_MESSAGE_BYTES,
        )
        config.update(options)
        try:
            self._producer = KafkaProducer(**config)
        except KafkaError as exc:
            raise EventLogError(
                f"cannot connect a producer to Kafka at {bootstrap}: {exc}"
            ) from exc
        self.bootstrap = bootstrap
        self._pending: list[Any] = []

    def append(self, topic: str, key: bytes | None, value: bytes) -> None:
        try:
            self._pending.append(self._producer.send(topic, key=key, value=value))
        except KafkaError as exc:
            raise EventLogError(f"Kafka at {self.bootstrap} refused a record: {exc}") from exc

    def flush(self, timeout: float = 30.0) -> None:
        try:
            self._producer.flush(timeout=timeout)
        except KafkaError as exc:
            raise EventLogError(
                f"Kafka at {self.bootstrap} did not confirm records: {exc}"
            ) from exc
        pending, self._pending = self._pending, []
        failed = [f for f in pending if not f.succeeded()]
        if failed:
            self._pending = failed  # still unconfirmed: the caller retries or spools them
            raise EventLogError(
                f"Kafka at {self.bootstrap} did not confirm {len(failed)} records: "
                f"{failed[0].exception!r}"
            )

    def close(self) -> None:
        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=10)


class KafkaReader(EventLogReader):
    def __init__(
        self, bootstrap: str, topics: list[str], group: str, from_beginning: bool = True
    ) -> None:
        try:
            self._consumer = KafkaConsumer(
                *topics,
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest" if from_beginning else "latest",
                fetch_max_bytes=64 * 1024 * 1024,
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            )
        except KafkaError as exc:
            raise EventLogError(
                f"cannot connect a consumer to Kafka at {bootstrap}: {exc}"
            ) from exc

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[LogRecord]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        except KafkaError as exc:
            raise EventLogError(f"Kafka poll failed: {exc}") from exc
        out = [
            LogRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
            for records in batches.values()
            for r in records
        ]
        out.sort(key=lambda r: (r.topic, r.partition, r.offset))
        return out

    def commit(self, positions: dict[tuple[str, int], int] | None = None) -> None:
        try:
            if positions:
                from kafka import TopicPartition
                from kafka.structs import OffsetAndMetadata

                self._consumer.commit(
                    {
                        TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                        for (t, p), o in positions.items()
                    }
                )
                return
            self._consumer.commit()
        except KafkaError as exc:
            raise EventLogError(f"Kafka commit failed: {exc}") from exc

    def close(self) -> None:
        self._consumer.close()
