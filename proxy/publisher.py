"""Publish records to the event log without blocking responses, and never lose one.

``publish`` puts frames on a bounded queue (it waits only while the queue is full). A worker
thread appends them to the event log and flushes. While the log is unavailable, frames go to a
local spool (the embedded local log) and are replayed, in order and before anything newer, once
the log is back. Delivery is at least once: consumers deduplicate by event id.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, EventLogWriter
from infra.eventlog.local import LocalLog
from schemas.codec import Record, encode_message
from schemas.errors import EventLogError

log = logging.getLogger("openforge.proxy.publisher")
_STOP = object()
Frame = tuple[bytes, bytes, int]  # (key, frame, records in it)


def frames_of(records: list[Record], max_per_frame: int = 32) -> list[Frame]:
    """Records as frames keyed by rollout id: each rollout's records keep their order, and a run
    of same-typed records of one rollout shares a frame (Arrow's per-frame cost is paid once)."""
    by_rollout: dict[str, list[Record]] = {}
    for record in records:
        by_rollout.setdefault(record.rollout_id, []).append(record)
    frames: list[Frame] = []
    for rollout_id, group in by_rollout.items():
        key, run = rollout_id.encode(), [group[0]]
        for record in group[1:]:
            if type(record) is type(run[0]) and len(run) < max_per_frame:
                run.append(record)
                continue
            frames.append((key, encode_message(run, compress=True), len(run)))
            run = [record]
        frames.append((key, encode_message(run, compress=True), len(run)))
    return frames


@dataclass
class PublisherStats:
    published: int = 0
    spooled: int = 0
    replayed_frames: int = 0  # spool frames (each one or more records) sent after an outage
    failures: int = 0


class Publisher:
    """Background publisher with a spool. ``writer_factory`` opens the event log (may raise)."""

    def __init__(
        self,
        writer_factory: Callable[[], EventLogWriter],
        spool_dir: Path,
        topic: str = EVENTS_TOPIC,
        queue_size: int = 10_000,
        retry_interval: float = 2.0,
        on_publish: Callable[[int, int], None] | None = None,
    ) -> None:
        self._factory = writer_factory
        self._topic = topic
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._spool = LocalLog(spool_dir)
        self._spool_writer = self._spool.writer()
        self._retry_interval = retry_interval
        self._on_publish = on_publish or (lambda published, spooled: None)
        self._writer: EventLogWriter | None = None
        self._next_retry = 0.0
        self._done = threading.Condition()
        self._enqueued = self._handled = 0
        self._max_batch = 128
        self.stats = PublisherStats()
        self._spooled_pending = False
        self._thread = threading.Thread(target=self._run, name="openforge-publisher", daemon=True)
        self._thread.start()

    # --- producer side ------------------------------------------------------------------------

    def publish(self, records: Sequence[Record]) -> None:
        """Queue records; the worker encodes them (one frame each, keyed by rollout id)."""
        for record in records:
            with self._done:
                self._enqueued += 1
            self._queue.put(record)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything queued so far is published or spooled."""
        with self._done:
            target = self._enqueued
            return self._done.wait_for(lambda: self._handled >= target, timeout)

    def _handled_batch(self, n: int) -> None:
        with self._done:
            self._handled += n
            self._done.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._writer is not None:
            with contextlib.suppress(EventLogError):
                self._writer.close()
        self._spool_writer.close()

    # --- worker side --------------------------------------------------------------------------

    def _spool_backlog(self) -> bool:
        reader = self._spool.reader([self._topic], group="publisher")
        try:
            return bool(reader.poll(max_records=1, timeout=0))
        finally:
            reader.close()

    def _connect(self) -> EventLogWriter | None:
        if self._writer is None and time.monotonic() >= self._next_retry:
            try:
                self._writer = self._factory()
            except EventLogError as exc:
                log.warning("event log unavailable, spooling: %s", exc)
                self._next_retry = time.monotonic() + self._retry_interval
        return self._writer

    def _fail(self, exc: EventLogError) -> None:
        # Any event-log error (an outage, or a frame the log refuses as corrupt or too large)
        # spools and retries, as before the split into EventLogUnavailable / EventLogCorrupt;
        # dead-lettering refused frames is the reliability issue's work.
        log.warning("event log failed, spooling: %s", exc)
        self.stats.failures += 1
        if self._writer is not None:
            with contextlib.suppress(EventLogError):
                self._writer.close()
        self._writer = None
        self._next_retry = time.monotonic() + self._retry_interval

    def _replay_spool(self, writer: EventLogWriter) -> bool:
        """Send the spool's backlog; True when it is empty."""
        reader = self._spool.reader([self._topic], group="publisher")
        try:
            while True:
                records = reader.poll(max_records=1000, timeout=0)
                if not records:
                    return True
                for r in records:
                    writer.append(self._topic, r.key, r.value)
                writer.flush()
                reader.commit()
                self.stats.replayed_frames += len(records)
        except EventLogError as exc:
            self._fail(exc)
            return False
        finally:
            reader.close()

    def _to_spool(self, frames: list[Frame]) -> None:
        for key, frame, _ in frames:
            self._spool_writer.append(self._topic, key, frame)
        self._spool_writer.flush()
        n = sum(count for _, _, count in frames)
        self.stats.spooled += n
        self._on_publish(0, n)

    def _send(self, frames: list[Frame]) -> None:
        writer = self._connect()
        if writer is not None and self._spooled_pending and not self._replay_spool(writer):
            writer = None
        if writer is not None:
            self._spooled_pending = False
            try:
                for key, frame, _ in frames:
                    writer.append(self._topic, key, frame)
                writer.flush()
                n = sum(count for _, _, count in frames)
                self.stats.published += n
                self._on_publish(n, 0)
                return
            except EventLogError as exc:
                self._fail(exc)
        self._to_spool(frames)
        self._spooled_pending = True

    def _run(self) -> None:
        self._spooled_pending = self._spool_backlog()
        stopping = False
        while not stopping:
            try:
                item = self._queue.get(timeout=self._retry_interval)
            except queue.Empty:
                if self._spooled_pending:
                    writer = self._connect()
                    if writer is not None and self._replay_spool(writer):
                        self._spooled_pending = False
                continue
            records: list[Record] = []
            while item is not _STOP:
                records.append(item)  # type: ignore[arg-type]
                if len(records) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stopping = item is _STOP
            if records:
                try:
                    self._send(frames_of(records))
                except EventLogError as exc:  # the spool itself failed: nothing else to try
                    log.error("cannot spool %d records: %s", len(records), exc)
                    raise
                finally:
                    self._handled_batch(len(records))
        writer = self._connect() if self._spooled_pending else None
        if writer is not None:
            self._replay_spool(writer)
