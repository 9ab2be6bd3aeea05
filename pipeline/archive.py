"""The raw events to the run's Parquet archive, as the streaming job reads them.

Every completion, rollout (lifecycle) and reward event the job reads from the event log is
written to the archive (``ROOT/record=NAME/date=...``, :mod:`schemas.archive`) at the end of the
bundle that read it, so the run can be replayed, rebuilt and audited later
(``openforge pipeline replay``, ``openforge replay rebuild``, ``openforge query``).

Redelivery: an event id is archived once per job, and a job started again on the same archive
first reads the event ids already there (a restarted job reads the log from its start), so
neither an at-least-once log nor a restart fills the archive with copies. Workers of a
distributed job each keep their own ids; the few copies that can then remain are removed by the
query views (by event id). A frame that cannot be decoded, or a record that does not fit its
schema, is counted (``events_not_archived``) and logged, and the others are written.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics.metric import Metrics

from schemas.archive import ArchiveWriter, archive_files
from schemas.codec import decode_message
from schemas.completion import CompletionEvent
from schemas.errors import SchemaError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

log = logging.getLogger(__name__)

Event = CompletionEvent | RolloutEvent | RewardEvent
EVENT_RECORDS = ("completion", "rollout", "reward")
NAMESPACE = "openforge.pipeline"


def archived_event_ids(root: Path) -> set[str]:
    """The ids of the events already in the archive at ``root`` (a file that cannot be read is
    logged and its events count as not archived: they are written again)."""
    ids: set[str] = set()
    for name in EVENT_RECORDS:
        for path in archive_files(root, name):
            try:
                column = pq.read_table(path, columns=["event_id"]).column("event_id")
            except (pa.ArrowInvalid, OSError, KeyError) as exc:
                log.warning(
                    "archive file %s is unreadable (%s); its events are archived again", path, exc
                )
                continue
            ids.update(str(v) for v in column.to_pylist())
    return ids


@dataclass
class ArchiveCounts:
    archived: int = 0
    already: int = 0  # an event id archived before (redelivered, or a restarted job)
    rejected: int = 0  # could not be decoded or does not fit its schema


class EventArchive:
    """Frames in (:meth:`add`), their events written to the archive at ``root`` (:meth:`flush`),
    each event id once (see the module docstring)."""

    def __init__(self, root: Path, seen: set[str] | None = None) -> None:
        self.writer = ArchiveWriter(Path(root))
        self.seen = archived_event_ids(Path(root)) if seen is None else seen
        self._buffer: dict[str, Event] = {}

    def add(self, frame: bytes) -> ArchiveCounts:
        counts = ArchiveCounts()
        try:
            records = decode_message(frame)
        except SchemaError as exc:
            log.warning("a frame of %d bytes is not archived: %s", len(frame), exc)
            counts.rejected += 1
            return counts
        for record in records:
            if not isinstance(record, CompletionEvent | RolloutEvent | RewardEvent):
                log.warning("a %s in the events topic is not archived", type(record).__name__)
                counts.rejected += 1
            elif record.event_id in self.seen or record.event_id in self._buffer:
                counts.already += 1
            else:
                self._buffer[record.event_id] = record
        return counts

    def flush(self) -> ArchiveCounts:
        """Write what was added since the last flush. Only written ids count as seen, so a
        flush that fails (a full disk) leaves them to be written when the bundle is retried."""
        counts = ArchiveCounts()
        events, self._buffer = list(self._buffer.values()), {}
        if not events:
            return counts
        try:
            self.writer.write(events)
            good = events
        except SchemaError:  # one record that does not fit its schema: the others still go
            good = []
            for event in events:
                try:
                    self.writer.write([event])
                    good.append(event)
                except SchemaError as exc:
                    log.warning("event %s is not archived: %s", event.event_id, exc)
                    counts.rejected += 1
        self.seen.update(e.event_id for e in good)
        counts.archived += len(good)
        return counts

    def discard(self) -> None:
        """Forget what was added and not flushed (a bundle that will be retried)."""
        self._buffer = {}


class _ArchiveEventsFn(beam.DoFn):
    def __init__(self, root: str) -> None:
        self.root = root
        self.archived = Metrics.counter(NAMESPACE, "events_archived")
        self.already = Metrics.counter(NAMESPACE, "events_already_archived")
        self.rejected = Metrics.counter(NAMESPACE, "events_not_archived")

    def setup(self) -> None:
        self._archive = EventArchive(Path(self.root))

    def start_bundle(self) -> None:
        self._archive.discard()

    def process(self, element: tuple[str, bytes]) -> Iterator[Any]:
        self._count(self._archive.add(element[1]))
        return iter(())

    def finish_bundle(self) -> None:
        self._count(self._archive.flush())

    def _count(self, counts: ArchiveCounts) -> None:
        self.archived.inc(counts.archived)
        self.already.inc(counts.already)
        self.rejected.inc(counts.rejected)


class ArchiveEvents(beam.PTransform):
    """``(rollout_id, frame)`` pairs: their events written to the archive at ``root``."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def expand(self, frames: Any) -> Any:
        return frames | "WriteEventArchive" >> beam.ParDo(_ArchiveEventsFn(self.root))
