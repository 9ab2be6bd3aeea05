"""The restriction of the event-log source: a growable range of one partition's record offsets.

A partition is read as the splittable-DoFn restriction ``[start, END)`` over record offsets
(``END`` = ``sys.maxsize``: the log grows without bound). Like Beam Java's
``GrowableOffsetRangeTracker``, the tracker measures its work against the partition's end
offset, not against ``END``:

- a split at any fraction of the remainder lands at an offset no later than the current end (at
  least the next offset), so the residual resumes at exactly the next unread record and a
  runner never hands the reader a position past the end of the log;
- progress and :meth:`LogRanges.restriction_size` report the backlog (end offset minus position),
  which runners use to decide whether to split and to scale;
- a range a split made finite, ``[start, stop)``, is read to ``stop`` and then done.

A split at a fraction above 0 hands the residual to the runner while the primary is still being
read: on a runner that runs both at once (Prism does), the residual's records could be delivered
before the primary's, and Prism takes the watermark of whichever restriction reported last, not
the least of them. So, in one worker process, a residual does not start reading until its
primary's bundle has finished (:class:`OpenSplits`); the episode assembly waits for the
watermark, which then never passes records still on their way.

End offsets come from :class:`EndOffsets`: the reader's own reads report them as they go
(free), and a dedicated reader answers for a partition not read recently (splits and sizes are
asked from the runner's thread while ``process`` reads, so they never use the DoFn's reader).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from apache_beam.io.iobase import RestrictionProgress
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider

from infra.eventlog import EventLogReader, open_reader

END = sys.maxsize
Partition = tuple[str, str, int]  # (event-log URL, topic, partition): the source's element


class PartitionRange(OffsetRange):
    """Record offsets ``[start, stop)`` of one partition; ``stop == END`` while it may grow."""

    def __init__(self, partition: Partition, start: int, stop: int = END) -> None:
        super().__init__(start, stop)  # type: ignore[no-untyped-call]
        self.partition = partition

    def split_at(self, split_pos: int) -> tuple[PartitionRange, PartitionRange]:
        return (
            PartitionRange(self.partition, self.start, split_pos),
            PartitionRange(self.partition, split_pos, self.stop),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartitionRange) and (self.partition, self.start, self.stop) == (
            other.partition,
            other.start,
            other.stop,
        )

    def __hash__(self) -> int:
        return hash((self.partition, self.start, self.stop))

    def __repr__(self) -> str:
        stop = "END" if self.stop == END else self.stop
        return f"PartitionRange({self.partition}, {self.start}, {stop})"

    def __reduce__(self) -> tuple[Any, ...]:
        return PartitionRange, (self.partition, self.start, self.stop)


@dataclass
class _Known:
    end: int
    at: float  # time.monotonic() when it was learnt


class EndOffsets:
    """Latest known end offset of each partition, shared by the source's DoFn, trackers and
    restriction provider in one worker process. Thread safe."""

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self._known: dict[Partition, _Known] = {}
        self._readers: dict[str, EventLogReader] = {}
        self._lock = threading.Lock()

    def note(self, partition: Partition, end: int) -> None:
        """Record an end offset a read returned (ends only grow)."""
        with self._lock:
            known = self._known.get(partition)
            if known is None or end >= known.end:
                self._known[partition] = _Known(end, time.monotonic())

    def get(self, partition: Partition, refresh: bool = False) -> int:
        """The partition's end offset, from a read at most ``max_age_s`` old, or read now."""
        with self._lock:
            known = self._known.get(partition)
            fresh = known is not None and time.monotonic() - known.at <= self.max_age_s
            if fresh and not refresh:
                return known.end  # type: ignore[union-attr]
            url, topic, number = partition
            reader = self._readers.get(url)
            if reader is None:
                reader = self._readers[url] = open_reader(url)
            end = reader.end_offset(topic, number)
            if known is not None:
                end = max(end, known.end)
            self._known[partition] = _Known(end, time.monotonic())
            return end

    def close(self) -> None:
        """Close the readers it opened (it opens them again if asked later)."""
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()


END_OFFSETS = EndOffsets()  # one per worker process


class OpenSplits:
    """Split points whose primary is still being read, per partition, in this worker process.
    A residual starting at such a point waits (at most ``max_wait_s``: a primary on another
    worker, or one that failed, is never seen to finish here)."""

    def __init__(self, max_wait_s: float = 60.0) -> None:
        self.max_wait_s = max_wait_s
        self._open: dict[tuple[Partition, int], float] = {}
        self._lock = threading.Lock()

    def opened(self, partition: Partition, split: int) -> None:
        with self._lock:
            self._open[(partition, split)] = time.monotonic()

    def closed(self, partition: Partition, split: int) -> None:
        with self._lock:
            self._open.pop((partition, split), None)

    def primary_running(self, partition: Partition, start: int) -> bool:
        """True while the primary ending at ``start`` is being read (up to ``max_wait_s``)."""
        with self._lock:
            since = self._open.get((partition, start))
            return since is not None and time.monotonic() - since < self.max_wait_s


OPEN_SPLITS = OpenSplits()  # one per worker process


class GrowableRangeTracker(OffsetRestrictionTracker):
    """An offset-range tracker that splits and reports progress against the log's end offset
    while its range is open (``stop == END``), and as a plain offset range once it is finite."""

    def __init__(
        self,
        restriction: PartitionRange,
        ends: EndOffsets = END_OFFSETS,
        splits: OpenSplits = OPEN_SPLITS,
    ) -> None:
        super().__init__(restriction)
        self._partition = restriction.partition
        self._ends = ends
        self._splits = splits

    def _growing(self) -> bool:
        return bool(self._range.stop == END and self._range.start != END)

    def _end(self) -> int:
        return self._ends.get(self._partition)

    def try_split(self, fraction_of_remainder: float) -> Any:
        split = self._split(fraction_of_remainder)
        if split is not None and fraction_of_remainder > 0:
            self._splits.opened(self._partition, split[1].start)
        return split

    def _split(self, fraction_of_remainder: float) -> Any:
        if not self._growing():
            return super().try_split(fraction_of_remainder)  # type: ignore[no-untyped-call]
        if self._checkpointed:
            return None
        last: int | None = self._last_claim_attempt
        if last is not None and last >= END - 1:
            return None  # closed: nothing left to split off
        cur = self._range.start - 1 if last is None else last
        end = max(self._end(), cur + 1)  # at least the next offset
        split = cur + max(1, int((end - cur) * fraction_of_remainder))
        if split > end:
            return None
        if fraction_of_remainder == 0:
            self._checkpointed = True
        self._range, residual = self._range.split_at(split)
        return self._range, residual

    def current_progress(self) -> RestrictionProgress:
        if not self._growing():
            return super().current_progress()
        end = self._end()
        start = self._range.start
        last: int | None = self._last_claim_attempt
        done = 0 if last is None else max(0, last + 1 - start)
        remaining = max(0, end - (start + done))
        return RestrictionProgress(completed=done, remaining=remaining)  # type: ignore[no-untyped-call]

    def is_bounded(self) -> bool:
        return not self._growing()


class LogRanges(RestrictionProvider):
    """Restrictions of the source's elements ``(url, topic, partition)``."""

    def __init__(self, ends: EndOffsets | None = None) -> None:
        self._ends = ends

    def _end_offsets(self) -> EndOffsets:
        return END_OFFSETS if self._ends is None else self._ends

    def initial_restriction(self, element: Partition) -> PartitionRange:
        return PartitionRange(tuple(element), 0)  # type: ignore[arg-type]

    def create_tracker(self, restriction: PartitionRange) -> GrowableRangeTracker:
        return GrowableRangeTracker(restriction, self._end_offsets())

    def restriction_size(self, element: Partition, restriction: PartitionRange) -> int:
        """The backlog: records of the range written to the log and not yet read."""
        if restriction.start >= restriction.stop:
            return 0
        end = self._end_offsets().get(restriction.partition)
        return max(0, min(end, int(restriction.stop)) - int(restriction.start))

    def truncate(self, element: Partition, restriction: PartitionRange) -> PartitionRange | None:
        """On drain: read what is written by now, then stop."""
        end = self._end_offsets().get(restriction.partition, refresh=True)
        stop = min(end, restriction.stop)
        return PartitionRange(
            restriction.partition, restriction.start, max(stop, restriction.start)
        )
