"""Reading events into a pipeline: the event log (streaming, as a splittable DoFn) and the
Parquet archive (batch, for replay).

``ReadEventLog`` reads each topic partition of a Kafka cluster or the embedded local log with a
pure-Python splittable DoFn that follows Beam's contract on any runner (Prism, Flink, Dataflow;
FnApiRunner too): the restriction is a growable range of record offsets
(:mod:`pipeline.offsets`), each record is claimed at its offset, so splits and checkpoints at any
fraction resume at exactly the next record, and ``restriction_size`` is the backlog. Elements are
``(rollout_id, frame)`` stamped with the log's record time; the watermark estimator reports
event time: the latest record time read and, while a partition is caught up and idle, about
now (record times are append times). With ``stop_when_idle_s`` the read ends after that long
without new records (for tests and catch-up jobs). The source reads only through the event
log's reader interface (partition reads by record offset): no backend here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

from infra.eventlog import EVENTS_TOPIC, EventLogReader, PartitionBatch, open_reader
from pipeline.offsets import END, END_OFFSETS, OPEN_SPLITS, LogRanges, Partition
from pipeline.shards import Shard
from schemas.archive import archive_files
from schemas.codec import REGISTRY, decode_batch, encode_message, record_type
from schemas.errors import ConfigError

# Records read per process() call: each call ends in a checkpoint, and the runner may split the
# rest at any time. FnApiRunner (the in-process runner) needs the whole backlog in one call
# (pipeline.jobs passes a large number for it): it ignores SDF watermark estimators.
RECORDS_PER_CALL = 1000


class _ReadPartitionFn(beam.DoFn):
    """Element: ``(url, topic, partition)``; restriction: a :class:`PartitionRange` of it."""

    def __init__(
        self, stop_when_idle_s: float | None, records_per_call: int, poll_s: float = 0.2
    ) -> None:
        self.stop_when_idle_s = stop_when_idle_s
        self.records_per_call = records_per_call
        self.poll_s = poll_s
        self.records = Metrics.counter("openforge.pipeline", "log_records_read")
        self.checkpoints = Metrics.counter("openforge.pipeline", "log_read_checkpoints")
        self.split_ends = Metrics.counter("openforge.pipeline", "log_reads_ended_at_split")
        self._idle_since: dict[Partition, float] = {}

    def setup(self) -> None:
        self._readers: dict[str, EventLogReader] = {}

    def start_bundle(self) -> None:
        self._ended: list[tuple[Partition, int]] = []  # ranges that ended at a split point

    def finish_bundle(self) -> None:
        for partition, stop in self._ended:  # their records are now out: residuals may start
            OPEN_SPLITS.closed(partition, stop)
        self._ended = []

    def _reader(self, url: str) -> EventLogReader:
        reader = self._readers.get(url)
        if reader is None:
            reader = self._readers[url] = open_reader(url)
        return reader

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: Partition,
        tracker: Any = beam.DoFn.RestrictionParam(LogRanges()),
        watermark: Any = beam.DoFn.WatermarkEstimatorParam(
            ManualWatermarkEstimator.default_provider()
        ),
    ) -> Iterator[Any]:
        part: Partition = tuple(element)  # type: ignore[assignment]
        restriction = tracker.current_restriction()
        start, stop = restriction.start, restriction.stop
        if OPEN_SPLITS.primary_running(part, start):  # read after it (see pipeline.offsets)
            time.sleep(0.01)
            tracker.defer_remainder(Duration.of(0))
            return
        now = time.time()
        # A residual may start past the end the reader last saw (a split at the end estimate):
        # there is nothing to read there yet, and reading past the end is an error: wait.
        beyond = start > END_OFFSETS.get(part) and start > END_OFFSETS.get(part, refresh=True)
        idle = True  # caught up, and nothing emitted in this call
        if not beyond:
            batch = self._read(part, start, stop)
            idle = batch.caught_up and not batch.records
            if (yield from self._emit(part, batch, stop, tracker, watermark)):
                return  # the restriction is done
        self._checkpoint(part, stop, tracker, watermark, now, idle, beyond)

    def _read(self, part: Partition, start: int, stop: int) -> PartitionBatch:
        """The next records of the restriction ``[start, stop)``; notes the end offset seen."""
        url, topic, partition = part
        want = max(1, min(self.records_per_call, stop - start))
        batch = self._reader(url).read(topic, partition, start, want, timeout=self.poll_s)
        END_OFFSETS.note(part, batch.end_offset)
        return batch

    def _emit(
        self, part: Partition, batch: PartitionBatch, stop: int, tracker: Any, watermark: Any
    ) -> Generator[Any, None, bool]:
        """Claim and emit each record of ``batch`` at its offset, stamped with its record time
        (the watermark follows it); True where the restriction is done: split off before a
        record, or a finite range read to its stop."""
        records = batch.records
        for record in records:
            if not tracker.try_claim(record.offset):
                self.records.inc(records.index(record))
                self._end_at_split(part, tracker)
                return True  # split: the rest of the range belongs to another restriction
            ts = Timestamp(micros=record.timestamp_ms * 1000)
            current = watermark.current_watermark()
            if current is None or ts > current:
                watermark.set_watermark(ts)
            yield TimestampedValue(((record.key or b"").decode(), record.value), ts)
        self.records.inc(len(records))
        whole = batch.next_offset >= stop or (batch.caught_up and batch.end_offset >= stop)
        if stop != END and whole:
            # Finite range (made so by a split), read to its stop or every offset in it
            # written: done, even where offsets carry no record (Kafka's transaction markers).
            if batch.next_offset < stop:
                tracker.try_claim(stop - 1)
            self._end_at_split(part, tracker)
            return True
        return False

    def _checkpoint(
        self,
        part: Partition,
        stop: int,
        tracker: Any,
        watermark: Any,
        now: float,
        idle: bool,
        beyond: bool,
    ) -> None:
        """End a call that did not finish the restriction ``[..., stop)``: close it after
        ``stop_when_idle_s`` without new records; else, where the call was ``idle`` (caught up,
        nothing emitted), advance the watermark to about now; then resume at once."""
        if not idle:
            self._idle_since[part] = now
        idle_since = self._idle_since.setdefault(part, now)
        if self.stop_when_idle_s is not None and now - idle_since >= self.stop_when_idle_s:
            tracker.try_claim(stop - 1)  # done: close the restriction
            return
        # Caught up, and nothing emitted in this call (so no element of it can fall behind):
        # event time may advance to about now.
        if idle:
            current = watermark.current_watermark()
            idle_mark = Timestamp.of(now - 1.0)
            if current is None or idle_mark > current:
                watermark.set_watermark(idle_mark)
        self.checkpoints.inc()
        if beyond:  # no read waited for data: wait here (a runner may resume at once)
            time.sleep(self.poll_s)
        # Resume at once: a read of a caught-up partition waits up to poll_s for new records.
        tracker.defer_remainder(Duration.of(0))

    def _end_at_split(self, part: Partition, tracker: Any) -> None:
        self.split_ends.inc()
        self._ended.append((part, tracker.current_restriction().stop))

    def teardown(self) -> None:
        for reader in getattr(self, "_readers", {}).values():
            reader.close()
        END_OFFSETS.close()


def partitions(url: str, topic: str) -> list[int]:
    """The topic's partitions (on Kafka, waits up to 30 s for the topic to appear)."""
    with open_reader(url) as reader:
        return reader.partitions(topic, timeout=30.0)


class ReadEventLog(beam.PTransform):
    """``(rollout_id, frame)`` pairs from the event log at ``url``, unbounded; with ``shard``,
    from its partitions only (:mod:`pipeline.shards`)."""

    def __init__(
        self,
        url: str,
        topic: str = EVENTS_TOPIC,
        stop_when_idle_s: float | None = None,
        records_per_call: int = RECORDS_PER_CALL,
        shard: Shard = Shard(),  # frozen: one shared default is safe
    ):
        super().__init__()
        self.url, self.topic, self.stop_when_idle_s = url, topic, stop_when_idle_s
        self.records_per_call, self.shard = records_per_call, shard

    def expand(self, pbegin: Any) -> Any:
        mine = self.shard.mine(partitions(self.url, self.topic), self.topic)
        parts = [(self.url, self.topic, p) for p in mine]
        return (
            pbegin
            | "Partitions" >> beam.Create(parts)
            | "ReadPartitions"
            >> beam.ParDo(_ReadPartitionFn(self.stop_when_idle_s, self.records_per_call))
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
