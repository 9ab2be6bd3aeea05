"""Writing episodes: to an event-log topic (Kafka or local) and to the Parquet archive."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

from infra.eventlog import EPISODES_TOPIC, EventLogWriter, open_writer
from schemas.archive import ArchiveWriter
from schemas.codec import encode_message
from schemas.episode import Episode


class _WriteEpisodesFn(beam.DoFn):
    def __init__(self, url: str | None, topic: str, archive: str | None) -> None:
        self.url, self.topic, self.archive = url, topic, archive
        self.written = Metrics.counter("openforge.pipeline", f"written_{topic}")

    def setup(self) -> None:
        self._writer: EventLogWriter | None = open_writer(self.url) if self.url else None
        self._archive = ArchiveWriter(Path(self.archive)) if self.archive else None

    def start_bundle(self) -> None:
        self._buffer: list[Episode] = []

    def process(self, episode: Episode) -> Iterator[Episode]:
        if self._writer is not None:
            self._writer.append(
                self.topic, episode.rollout_id.encode(), encode_message([episode], compress=True)
            )
        self._buffer.append(episode)
        yield episode

    def finish_bundle(self) -> None:
        if self._writer is not None:
            self._writer.flush()
        if self._archive is not None and self._buffer:
            self._archive.write(self._buffer)
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
