"""Publish records to the event log without blocking the event loop, and lose none.

``publish`` queues records and returns at once with a :class:`Receipt` (the queue has no bound
of its own; new calls are refused with a 503 long before it grows, see
:meth:`Publisher.problem`). A worker thread encodes them into frames keyed by rollout id,
appends them to the event log and flushes. While the log is unavailable, frames go to a local
spool (the embedded local log) and are replayed, in order and before anything newer, once the
log is back. Delivery is at least once: consumers deduplicate by event id.

Every record ends in exactly one of three places, and is durable there before its receipt
resolves: the event log (after the log's ``flush``: Kafka with ``acks=all``, the local log's
fsync, or with ``log_fsync`` off its write to the OS), the spool (fsync), or the dead-letter
file (:mod:`proxy.deadletter`, fsync) when the codec cannot encode it or its frame is over the
log's message limit (a frame of several records over the limit is split first). A poison
record never stops the worker. Any other failure of a batch (the spool's disk failing, a bug)
keeps the batch and retries it every ``retry_interval``: the worker supervises itself.
Meanwhile :meth:`Publisher.problem` says why, so new calls get a 503 and ``/health`` is not ok:
a call is never answered and left unrecorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, EventLogWriter
from infra.eventlog.local import LocalLog
from proxy.deadletter import DeadLetters
from schemas.codec import RolloutRecord, encode_message
from schemas.errors import EventLogError

log = logging.getLogger("openforge.proxy.publisher")
_STOP = object()
Frame = tuple[bytes, bytes, int]  # (key, frame, records in it)
Item = tuple[RolloutRecord, "Future[None] | None"]  # a record, and the receipt its publish waits on
FRAME_MARGIN = 64 * 1024  # room under the log's message limit for the key and the envelope
FLUSH_TIMEOUT = 5.0  # seconds the log may take to confirm a batch before it goes to the spool
DEAD_AFTER_ATTEMPTS = 3  # a batch that fails this often for a reason not the log's is dead


def runs_of(
    records: Sequence[RolloutRecord], max_per_frame: int = 32
) -> list[tuple[bytes, list[RolloutRecord]]]:
    """Records grouped for frames keyed by rollout id: each rollout's records keep their order,
    and a run of same-typed records of one rollout shares a frame (Arrow's per-frame cost is
    paid once)."""
    by_rollout: dict[str, list[RolloutRecord]] = {}
    for record in records:
        by_rollout.setdefault(str(record.rollout_id), []).append(record)
    out: list[tuple[bytes, list[RolloutRecord]]] = []
    for rollout_id, group in by_rollout.items():
        key, run = rollout_id.encode("utf-8", "backslashreplace"), [group[0]]
        for record in group[1:]:
            if type(record) is type(run[0]) and len(run) < max_per_frame:
                run.append(record)
                continue
            out.append((key, run))
            run = [record]
        out.append((key, run))
    return out


@dataclass
class PublisherStats:
    published: int = 0
    spooled: int = 0
    replayed_frames: int = 0  # spool frames (each one or more records) sent after an outage
    failures: int = 0  # event-log failures (each sent the batch to the spool)
    dead_lettered: int = 0  # records written to the dead-letter file
    worker_errors: int = 0  # batches that failed and were retried (the spool failed, a bug)


class Receipt:
    """Resolves once every record of one :meth:`Publisher.publish` is durable."""

    def __init__(self, future: Future[None]) -> None:
        self._future = future

    @property
    def done(self) -> bool:
        return self._future.done()

    async def wait(self, timeout: float) -> bool:
        """Wait without blocking the event loop; False if ``timeout`` seconds passed first."""
        if self._future.done():
            return True
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._future)), timeout)
        except TimeoutError:
            return False
        return True


class Publisher:
    """Background publisher with a spool and a dead-letter file (both in ``spool_dir``).

    ``writer_factory`` opens the event log (may raise EventLogError). ``high_water``: pending
    records at which :meth:`problem` reports that publishing cannot keep up.
    ``max_message_bytes``: the log's message limit (None: none).
    """

    def __init__(
        self,
        writer_factory: Callable[[], EventLogWriter],
        spool_dir: Path,
        topic: str = EVENTS_TOPIC,
        high_water: int = 5_000,
        retry_interval: float = 2.0,
        on_publish: Callable[[int, int], None] | None = None,
        on_dead_letter: Callable[[int], None] | None = None,
        max_message_bytes: int | None = None,
    ) -> None:
        self._factory = writer_factory
        self._topic = topic
        self._queue: queue.Queue[object] = queue.Queue()  # unbounded: publish never blocks
        self._high_water = high_water
        self._spool = LocalLog(spool_dir)
        self._spool_writer = self._spool.writer()
        self.dead_letters = DeadLetters(spool_dir)
        self._retry_interval = retry_interval
        self._on_publish = on_publish or (lambda published, spooled: None)
        self._on_dead_letter = on_dead_letter or (lambda n: None)
        self._frame_limit = None if max_message_bytes is None else max_message_bytes - FRAME_MARGIN
        self._writer: EventLogWriter | None = None
        self._next_retry = 0.0
        self._done = threading.Condition()
        self._enqueued = self._handled = 0
        self._max_batch = 128
        self._stalled: str | None = None
        self._last: Future[None] = Future()
        self._last.set_result(None)
        self.stats = PublisherStats()
        self._spooled_pending = True  # until the spool is seen empty: replay before new frames
        self._thread = threading.Thread(target=self._run, name="openforge-publisher", daemon=True)
        self._thread.start()

    # --- producer side ------------------------------------------------------------------------

    def publish(self, records: Sequence[RolloutRecord]) -> Receipt:
        """Queue records (never blocks); the receipt resolves when all are durable."""
        future: Future[None] = Future()
        if not records:
            future.set_result(None)
            return Receipt(future)
        with self._done:
            self._enqueued += len(records)
        for record in records[:-1]:
            self._queue.put((record, None))
        self._queue.put((records[-1], future))  # FIFO: handled last, so after all the others
        self._last = future
        return Receipt(future)

    def barrier(self) -> Receipt:
        """A receipt that resolves once everything published so far is durable."""
        return Receipt(self._last)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def problem(self) -> str | None:
        """Why new records may not be recorded in time (None: publishing is healthy)."""
        if not self._thread.is_alive():
            return "the event publisher has stopped: restart the proxy"
        if self._stalled is not None:
            return self._stalled
        pending = self.pending
        if pending >= self._high_water:
            return (
                f"{pending} records wait to be published (limit {self._high_water}): "
                "the event log is not keeping up; retry shortly"
            )
        return None

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything queued so far is published, spooled or dead-lettered."""
        with self._done:
            target = self._enqueued
            return self._done.wait_for(lambda: self._handled >= target, timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._writer is not None:
            with contextlib.suppress(EventLogError):
                self._writer.close()
        with contextlib.suppress(EventLogError):
            self._spool_writer.close()

    # --- worker side --------------------------------------------------------------------------

    def _connect(self) -> EventLogWriter | None:
        if self._writer is None and time.monotonic() >= self._next_retry:
            try:
                self._writer = self._factory()
            except EventLogError as exc:
                log.warning("event log unavailable, spooling: %s", exc)
                self._next_retry = time.monotonic() + self._retry_interval
        return self._writer

    def _fail(self, exc: EventLogError) -> None:
        # Any event-log error (an outage, or a frame the log refuses) spools and retries; frames
        # the log cannot take by their size were dead-lettered before they were sent.
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

    def _encode(
        self,
        key: bytes,
        run: list[RolloutRecord],
        frames: list[Frame],
        dead: list[tuple[RolloutRecord, str]],
    ) -> None:
        """Frames of ``run`` into ``frames`` (split while over the limit), poison into ``dead``."""
        try:
            frame = encode_message(run, compress=True)
        except Exception as exc:
            if len(run) == 1:
                dead.append((run[0], f"cannot encode: {exc!r}"))
                return
            for record in run:  # find the poison; the others keep their order
                self._encode(key, [record], frames, dead)
            return
        limit = self._frame_limit
        if limit is not None and len(frame) > limit:
            if len(run) == 1:
                reason = f"its frame is {len(frame)} bytes, over the event log's limit of {limit}"
                dead.append((run[0], reason))
                return
            half = len(run) // 2
            self._encode(key, run[:half], frames, dead)
            self._encode(key, run[half:], frames, dead)
            return
        frames.append((key, frame, len(run)))

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
                writer.flush(FLUSH_TIMEOUT)  # well inside record_timeout: calls wait on this
                n = sum(count for _, _, count in frames)
                self.stats.published += n
                self._on_publish(n, 0)
                return
            except EventLogError as exc:
                self._fail(exc)
        self._to_spool(frames)  # raises EventLogError if the spool's disk fails
        self._spooled_pending = True

    def _take(self) -> tuple[list[Item], bool]:
        """The next batch (empty after ``retry_interval`` idle), and whether to stop after it."""
        try:
            item = self._queue.get(timeout=self._retry_interval)
        except queue.Empty:
            if self._spooled_pending:
                writer = self._connect()
                if writer is not None and self._replay_spool(writer):
                    self._spooled_pending = False
            return [], False
        items: list[Item] = []
        while item is not _STOP:
            items.append(item)  # type: ignore[arg-type]
            if len(items) >= self._max_batch:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        return items, item is _STOP

    def _dead_letter(self, record: RolloutRecord, reason: str) -> None:
        log.error("dead-lettered %s of %r: %s", type(record).__name__, record.rollout_id, reason)
        self.dead_letters.write(record, reason)
        self.stats.dead_lettered += 1
        self._on_dead_letter(1)

    def _finish(self, batch: list[Item]) -> None:
        with self._done:
            self._handled += len(batch)
            self._done.notify_all()
        for _, future in batch:
            if future is not None:
                future.set_result(None)

    def _run(self) -> None:
        batch: list[Item] = []
        frames: list[Frame] | None = None  # the batch's frames, kept across retries
        dead: list[tuple[RolloutRecord, str]] = []
        stopping, attempts = False, 0
        while True:
            try:
                if not batch:
                    batch, stopping = self._take()
                if batch:
                    if frames is None:
                        frames = []
                        for key, run in runs_of([record for record, _ in batch]):
                            self._encode(key, run, frames, dead)
                    while dead:
                        self._dead_letter(*dead[0])
                        dead.pop(0)
                    if frames:
                        self._send(frames)
                    self._finish(batch)
                    batch, frames, attempts = [], None, 0
                self._stalled = None
                if stopping:
                    break
            except Exception as exc:
                attempts += 1
                self.stats.worker_errors += 1
                log.exception("publisher batch failed (attempt %d); retrying", attempts)
                self._stalled = (
                    f"the proxy cannot store records ({exc}); new calls wait until it can"
                )
                if attempts >= DEAD_AFTER_ATTEMPTS and not isinstance(exc, EventLogError):
                    # Not the disk, and not going away: the batch itself breaks the worker.
                    dead += [(record, f"publishing failed: {exc!r}") for record, _ in batch]
                    frames = []
                time.sleep(self._retry_interval)
        writer = self._connect() if self._spooled_pending else None
        if writer is not None:
            self._replay_spool(writer)
