"""Reading events into a pipeline: the event log (streaming, as a splittable DoFn) and the
Parquet archive (batch, for replay).

``ReadEventLog`` reads each topic partition of a Kafka cluster or the embedded local log with a
pure-Python splittable DoFn (works on FnApiRunner ``--streaming``; on Flink/Spark/Dataflow too).
Elements are ``(rollout_id, frame)`` stamped with the log's record time; the watermark follows
the record times and, while a partition is idle, wall time. With ``stop_when_idle_s`` the read
ends after that long without new records (for tests and catch-up jobs).
"""

from __future__ import annotations

import os
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from infra.eventlog.base import EVENTS_TOPIC, parse_url
from schemas.archive import archive_files
from schemas.codec import REGISTRY, decode_batch, encode_message, record_type
from schemas.errors import EventLogError

END = sys.maxsize
_LOCAL_HEADER = struct.Struct(">IIQQi")


class _Partitions(RestrictionProvider):
    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, END)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return 1  # unbounded: size is unknown


class _ReadPartitionFn(beam.DoFn):
    """Element: ``(url, topic, partition)``. Positions: Kafka offsets, or local-log byte offsets."""

    def __init__(self, stop_when_idle_s: float | None, poll_s: float = 0.2) -> None:
        self.stop_when_idle_s = stop_when_idle_s
        self.poll_s = poll_s
        self.records = Metrics.counter("openforge.pipeline", "log_records_read")
        self._idle_since: dict[tuple[str, str, int], float] = {}

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: tuple[str, str, int],
        tracker: Any = beam.DoFn.RestrictionParam(_Partitions()),
        watermark: Any = beam.DoFn.WatermarkEstimatorParam(
            ManualWatermarkEstimator.default_provider()
        ),
    ) -> Iterator[Any]:
        url, topic, partition = element
        start = tracker.current_restriction().start
        kind, where = parse_url(url)
        read = self._read_local if kind == "local" else self._read_kafka
        got = 0
        for position, next_position, key, value, ts_ms in read(where, topic, partition, start):
            if not tracker.try_claim(position):
                return
            ts = Timestamp(micros=ts_ms * 1000)
            watermark.set_watermark(ts)
            got += 1
            yield TimestampedValue(((key or b"").decode(), value), ts)
            del next_position
        self.records.inc(got)
        now = time.time()
        if got:
            self._idle_since[element] = now
        idle_since = self._idle_since.setdefault(element, now)
        if self.stop_when_idle_s is not None and now - idle_since >= self.stop_when_idle_s:
            tracker.try_claim(END - 1)  # done: close the restriction
            return
        # Everything written so far is read: event time may advance to (almost) now.
        current = watermark.current_watermark()
        idle_mark = Timestamp.of(now - 1.0)
        if current is None or idle_mark > current:
            watermark.set_watermark(idle_mark)
        tracker.defer_remainder(Duration.of(self.poll_s))

    def _read_local(
        self, root: str, topic: str, partition: int, start: int
    ) -> Iterator[tuple[int, int, bytes | None, bytes, int]]:
        path = Path(root) / topic / "data.log"
        if not path.exists():
            return
        with open(path, "rb") as f:
            f.seek(start)
            position = start
            for _ in range(5000):  # a bundle's worth; the rest after a checkpoint
                header = f.read(_LOCAL_HEADER.size)
                if len(header) < _LOCAL_HEADER.size:
                    return
                length, crc, _offset, ts_ms, key_len = _LOCAL_HEADER.unpack(header)
                payload = f.read(length)
                if len(payload) < length:
                    return
                if zlib.crc32(payload) != crc:
                    raise EventLogError(f"{path} is corrupt at byte {position}")
                key = None if key_len < 0 else payload[:key_len]
                end = position + _LOCAL_HEADER.size + length
                yield position, end, key, payload[max(key_len, 0) :], ts_ms
                position = end

    def _read_kafka(
        self, servers: str, topic: str, partition: int, start: int
    ) -> Iterator[tuple[int, int, bytes | None, bytes, int]]:
        consumer = self._consumer(servers)
        from kafka import TopicPartition

        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        batches = consumer.poll(timeout_ms=int(self.poll_s * 1000), max_records=5000)
        for record in batches.get(tp, []):
            yield record.offset, record.offset + 1, record.key, record.value, record.timestamp

    def _consumer(self, servers: str) -> Any:
        consumer = getattr(self, "_kafka", None)
        if consumer is None:
            from kafka import KafkaConsumer

            consumer = KafkaConsumer(
                bootstrap_servers=servers,
                enable_auto_commit=False,
                max_partition_fetch_bytes=16 * 1024 * 1024,
            )
            self._kafka = consumer
        return consumer

    def teardown(self) -> None:
        consumer = getattr(self, "_kafka", None)
        if consumer is not None:
            consumer.close()


def partitions(url: str, topic: str) -> list[int]:
    kind, where = parse_url(url)
    if kind == "local":
        return [0]
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=where)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = consumer.partitions_for_topic(topic)
            if found:
                return sorted(found)
            consumer.topics()  # refresh metadata
            time.sleep(0.5)
    finally:
        consumer.close()
    raise EventLogError(f"topic {topic!r} not found on {where}: has the proxy published yet?")


class ReadEventLog(beam.PTransform):
    """``(rollout_id, frame)`` pairs from the event log at ``url``, unbounded."""

    def __init__(self, url: str, topic: str = EVENTS_TOPIC, stop_when_idle_s: float | None = None):
        super().__init__()
        self.url, self.topic, self.stop_when_idle_s = url, topic, stop_when_idle_s

    def expand(self, pbegin: Any) -> Any:
        parts = [(self.url, self.topic, p) for p in partitions(self.url, self.topic)]
        return (
            pbegin
            | "Partitions" >> beam.Create(parts)
            | "ReadPartitions" >> beam.ParDo(_ReadPartitionFn(self.stop_when_idle_s))
        )


class _ReadArchiveFileFn(beam.DoFn):
    def process(self, item: tuple[str, str]) -> Iterator[Any]:
        name, path = item
        import pyarrow.parquet as pq

        rtype = REGISTRY[name]
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=2048):
            batch = batch.replace_schema_metadata(parquet.schema_arrow.metadata)
            for record in decode_batch(rtype.cls, batch):
                at = Timestamp(micros=record_type(record).time_us(record))
                yield TimestampedValue((record.rollout_id, encode_message([record])), at)


class ReadArchive(beam.PTransform):
    """``(rollout_id, frame)`` pairs of every rollout event in a Parquet archive (bounded)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root)

    def expand(self, pbegin: Any) -> Any:
        files = [
            (name, str(p))
            for name in ("rollout", "completion", "reward")
            for p in archive_files(self.root, name)
        ]
        if not files:
            raise EventLogError(f"no rollout events in the archive at {self.root}")
        return (
            pbegin
            | "ArchiveFiles" >> beam.Create(files)
            | "Reshuffle" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadArchiveFileFn())
        )
