"""Reading events into a pipeline: the event log (streaming, as a splittable DoFn) and the
Parquet archive (batch, for replay).

``ReadEventLog`` reads each topic partition of a Kafka cluster or the embedded local log with a
pure-Python splittable DoFn (works on FnApiRunner ``--streaming``; on Flink/Spark/Dataflow too).
Elements are ``(rollout_id, frame)`` stamped with the log's record time; the watermark follows
the record times and, while a partition is idle, wall time. With ``stop_when_idle_s`` the read
ends after that long without new records (for tests and catch-up jobs). The source reads only
through the event log's reader interface (partition reads by record offset): no backend here.
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

from infra.eventlog import EVENTS_TOPIC, EventLogReader, open_reader
from schemas.archive import archive_files
from schemas.codec import REGISTRY, decode_batch, encode_message, record_type
from schemas.errors import ConfigError

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
    """Element: ``(url, topic, partition)``. Positions: record offsets (each record is claimed at
    its offset, so a checkpoint's remainder starts exactly at the next record)."""

    def __init__(self, stop_when_idle_s: float | None, poll_s: float = 0.2) -> None:
        self.stop_when_idle_s = stop_when_idle_s
        self.poll_s = poll_s
        self.records = Metrics.counter("openforge.pipeline", "log_records_read")
        self._idle_since: dict[tuple[str, str, int], float] = {}

    def setup(self) -> None:
        self._readers: dict[str, EventLogReader] = {}

    def _reader(self, url: str) -> EventLogReader:
        reader = self._readers.get(url)
        if reader is None:
            reader = self._readers[url] = open_reader(url)
        return reader

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
        batch = self._reader(url).read(
            topic, partition, start, MAX_RECORDS_PER_CALL, timeout=self.poll_s
        )
        for record in batch.records:
            if not tracker.try_claim(record.offset):
                return
            ts = Timestamp(micros=record.timestamp_ms * 1000)
            current = watermark.current_watermark()
            if current is None or ts > current:
                watermark.set_watermark(ts)
            yield TimestampedValue(((record.key or b"").decode(), record.value), ts)
        self.records.inc(len(batch.records))
        now = time.time()
        if batch.records or not batch.caught_up:
            self._idle_since[element] = now
        idle_since = self._idle_since.setdefault(element, now)
        if self.stop_when_idle_s is not None and now - idle_since >= self.stop_when_idle_s:
            tracker.try_claim(END - 1)  # done: close the restriction
            return
        # Caught up, and nothing emitted in this bundle (so no element of it can fall behind):
        # event time may advance to about now.
        if batch.caught_up and not batch.records:
            current = watermark.current_watermark()
            idle_mark = Timestamp.of(now - 1.0)
            if current is None or idle_mark > current:
                watermark.set_watermark(idle_mark)
        if not batch.records:
            time.sleep(self.poll_s)  # the local runner resumes at once, whatever delay we ask
        tracker.defer_remainder(Duration.of(self.poll_s))

    def teardown(self) -> None:
        for reader in getattr(self, "_readers", {}).values():
            reader.close()


def partitions(url: str, topic: str) -> list[int]:
    """The topic's partitions (on Kafka, waits up to 30 s for the topic to appear)."""
    with open_reader(url) as reader:
        return reader.partitions(topic, timeout=30.0)


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
            raise ConfigError(
                f"no rollout events in the archive at {self.root}: give the directory the "
                "pipeline archived events to"
            )
        return (
            pbegin
            | "ArchiveFiles" >> beam.Create(files)
            | "Reshuffle" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadArchiveFileFn())
        )
