"""Writing episodes: to an event-log topic (Kafka or local) and to the Parquet archive.

Writing to a topic is idempotent across restarts: a streaming job started again on the same log
reads the events from the start and rebuilds the same episodes (same ids, same contents), and
the sink writes only those the topic does not hold yet (``already_written`` counts the others).
An episode that supersedes a dead letter (same id, now complete) differs, and is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

from infra.eventlog import EPISODES_TOPIC, EventLogWriter, open_writer, records_in
from schemas.archive import ArchiveWriter
from schemas.codec import encode_message
from schemas.episode import Episode

Fingerprint = tuple[str, str | None, float | None, tuple[str, ...]]


def fingerprint(episode: Episode) -> Fingerprint:
    """What makes two writes of an episode the same (its build time aside)."""
    return (episode.episode_id, episode.dead_letter, episode.reward, tuple(sorted(episode.lineage)))


def episodes_in(url: str, topic: str) -> Iterator[Episode]:
    """Every episode in ``topic`` of the event log at ``url``, in log order (none if the topic
    does not exist yet); reads by offset, moving no consumer group."""
    return (r for r in records_in(url, topic) if isinstance(r, Episode))


def written(url: str, topic: str) -> set[Fingerprint]:
    """Fingerprints of the episodes already in ``topic``."""
    return {fingerprint(e) for e in episodes_in(url, topic)}


class _WriteEpisodesFn(beam.DoFn):
    def __init__(self, url: str | None, topic: str, archive: str | None) -> None:
        self.url, self.topic, self.archive = url, topic, archive
        self.written = Metrics.counter("openforge.pipeline", f"written_{topic}")
        self.skipped = Metrics.counter("openforge.pipeline", "already_written")

    def setup(self) -> None:
        self._writer: EventLogWriter | None = open_writer(self.url) if self.url else None
        self._archive = ArchiveWriter(Path(self.archive)) if self.archive else None
        self._done: set[Fingerprint] = written(self.url, self.topic) if self.url else set()

    def start_bundle(self) -> None:
        self._buffer: list[Episode] = []

    def process(self, episode: Episode) -> Iterator[Episode]:
        mark = fingerprint(episode)
        if mark in self._done:  # written by an earlier run of the job on this log
            self.skipped.inc()
            return
        self._done.add(mark)
        self._buffer.append(episode)
        yield episode

    def finish_bundle(self) -> None:
        # The archive first: an episode a reader of the log sees is archived already, so a job
        # stopped once its episodes are in the log (``openforge train`` does) loses none.
        if self._archive is not None and self._buffer:
            self._archive.write(self._buffer)
        if self._writer is not None:
            for episode in self._buffer:
                frame = encode_message([episode], compress=True)
                self._writer.append(self.topic, episode.rollout_id.encode(), frame)
            self._writer.flush()
        self.written.inc(len(self._buffer))
        self._buffer = []

    def teardown(self) -> None:
        if getattr(self, "_writer", None) is not None:
            self._writer.close()  # type: ignore[union-attr]


class WriteEpisodes(beam.PTransform):
    """Episodes to topic ``topic`` of the event log at ``url`` and/or a Parquet archive."""

    def __init__(self, url: str | None, archive: str | None = None, topic: str = EPISODES_TOPIC):
        super().__init__()
        self.url, self.archive, self.topic = url, archive, topic

    def expand(self, episodes: Any) -> Any:
        return episodes | f"Write[{self.topic}]" >> beam.ParDo(
            _WriteEpisodesFn(self.url, self.topic, self.archive)
        )
