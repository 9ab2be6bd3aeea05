"""A run's event log written out as its Parquet archive: what ``openforge query --run``,
``openforge audit`` and ``audit --compare`` read. A training run's pipeline archives events as
they come (``--run-archive``); ``openforge rollouts run`` has no pipeline, so it archives its
embedded log once its rollouts have ended."""

from __future__ import annotations

import shutil
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, open_reader
from pipeline.arrival import DECODE_ERRORS
from schemas.archive import ArchiveWriter
from schemas.codec import Record, decode_message


def archive_log(log_url: str, root: Path) -> tuple[int, int]:
    """Every event of ``log_url``'s events topic, written to a fresh archive at ``root`` (an
    archive made earlier is replaced: the log holds what it held and more): the events written,
    and the frames that could not be decoded (left out; the log keeps them)."""
    events: list[Record] = []
    damaged = 0
    reader = open_reader(log_url)
    try:
        for partition in reader.partitions(EVENTS_TOPIC):
            offset, end = 0, reader.end_offset(EVENTS_TOPIC, partition)
            while offset < end:
                batch = reader.read(EVENTS_TOPIC, partition, offset)
                for record in batch.records:
                    try:
                        events += decode_message(record.value)
                    except DECODE_ERRORS:
                        damaged += 1
                offset = batch.next_offset
    finally:
        reader.close()
    shutil.rmtree(root, ignore_errors=True)
    ArchiveWriter(root).write(events)
    return len(events), damaged
