"""The local Kafka broker: durable produce, consumer groups and committed offsets."""

from __future__ import annotations

import uuid

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from infra.local.kafka import KafkaBroker

N = 1000


def _consume(broker: KafkaBroker, topic: str, group: str, limit: int) -> list[int]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=limit,
        consumer_timeout_ms=15_000,
    )
    seen: list[int] = []
    try:
        for record in consumer:
            seen.append(int(record.value.decode()))
            if len(seen) == limit:
                break
        consumer.commit()
    finally:
        consumer.close()
    return seen


def test_produce_consume_resume_from_committed_offset(kafka_broker: KafkaBroker) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    admin.close()

    producer = KafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap, acks="all", enable_idempotence=True
    )
    futures = [producer.send(topic, key=b"k", value=str(i).encode()) for i in range(N)]
    producer.flush()
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close()
    assert offsets == list(range(N))

    group = f"g-{uuid.uuid4().hex[:8]}"
    first = _consume(kafka_broker, topic, group, limit=400)
    assert first == list(range(400))

    # A new consumer in the same group resumes from the committed offset: no repeats, no gaps.
    rest = _consume(kafka_broker, topic, group, limit=N - 400)
    assert rest == list(range(400, N))

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    committed = admin.list_group_offsets(group)[group]
    admin.close()
    assert committed[TopicPartition(topic, 0)].offset == N
