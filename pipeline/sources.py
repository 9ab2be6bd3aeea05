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
import sys
import time
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
from infra.eventlog.local import read_entries
from schemas.archive import archive_files
from schemas.codec import REGISTRY, decode_batch, encode_message, record_type
from schemas.errors import EventLogError

END = sys.maxsize
# Records read per process() call. Large on purpose: FnApiRunner (the local runner) ignores SDF
# watermark estimators and, after a mid-backlog checkpoint, can advance event time past elements
# it has not delivered yet, firing reward deadlines early. Reading the backlog in one call avoids
# that locally; Flink, Spark and Dataflow track the estimator's watermark.
MAX_RECORDS_PER_CALL = 200_000


class _Partitions(RestrictionProvider):
    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, END)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return 1  # unbounded: size is unknown


class _ReadPartitionFn(beam.DoFn):
    """Element: ``(url, topic, partition)``. Positions: Kafka offsets, or local-log byte offsets
    (a record is claimed at its last byte)."""

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
        records, caught_up = read(where, topic, partition, start)
        for last, key, value, ts_ms in records:
            # Claim the record's last position: a checkpoint's remainder then starts exactly at
            # the next record (local log: its byte offset; Kafka: its offset).
            if not tracker.try_claim(last):
                return
            ts = Timestamp(micros=ts_ms * 1000)
            current = watermark.current_watermark()
            if current is None or ts > current:
                watermark.set_watermark(ts)
            yield TimestampedValue(((key or b"").decode(), value), ts)
        self.records.inc(len(records))
        now = time.time()
        if records or not caught_up:
            self._idle_since[element] = now
        idle_since = self._idle_since.setdefault(element, now)
        if self.stop_when_idle_s is not None and now - idle_since >= self.stop_when_idle_s:
            tracker.try_claim(END - 1)  # done: close the restriction
            return
        # Caught up, and nothing emitted in this bundle (so no element of it can fall behind):
        # event time may advance to about now.
        if caught_up and not records:
            current = watermark.current_watermark()
            idle_mark = Timestamp.of(now - 1.0)
            if current is None or idle_mark > current:
                watermark.set_watermark(idle_mark)
        if not records:
            time.sleep(self.poll_s)  # the local runner resumes at once, whatever delay we ask
        tracker.defer_remainder(Duration.of(self.poll_s))

    def _read_local(
        self, root: str, topic: str, partition: int, start: int
    ) -> tuple[list[tuple[int, bytes | None, bytes, int]], bool]:
        """Up to a bundle's worth of entries from byte ``start``; caught up at the end of file."""
        path = Path(root) / topic / "data.log"
        if not path.exists():
            return [], True
        with open(path, "rb") as f:
            entries, at_end = read_entries(f, start, MAX_RECORDS_PER_CALL)
        return [(e.end - 1, e.key, e.value, e.timestamp_ms) for e in entries], at_end

    def _read_kafka(
        self, servers: str, topic: str, partition: int, start: int
    ) -> tuple[list[tuple[int, bytes | None, bytes, int]], bool]:
        """One poll from offset ``start``; caught up when nothing is left before the end offset."""
        from kafka import TopicPartition

        consumer = self._consumer(servers)
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        batches = consumer.poll(
            timeout_ms=int(self.poll_s * 1000), max_records=MAX_RECORDS_PER_CALL
        )
        out = [(r.offset, r.key, r.value, r.timestamp) for r in batches.get(tp, [])]
        next_offset = out[-1][0] + 1 if out else start
        end = consumer.end_offsets([tp]).get(tp, 0)
        return out, next_offset >= end

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
