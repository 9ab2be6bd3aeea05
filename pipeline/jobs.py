"""The two pipelines: streaming assembly from the event log, and batch replay from the archive.

Both are plain Beam pipelines: the runner and its options come from Beam arguments (``--runner
FlinkRunner --flink_master=...``, ``--runner DataflowRunner --project=...``, ``--runner
SparkRunner``...). Locally they default to Beam's portable FnApiRunner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC
from pipeline.assemble import DEAD_LETTER, AssembleEpisodes
from pipeline.sinks import WriteEpisodes
from pipeline.sources import ReadArchive, ReadEventLog


@dataclass
class Outputs:
    """Where episodes and dead letters go: an event-log URL and/or an archive directory."""

    log_url: str | None = None
    archive: str | None = None

    def sub(self, name: str) -> str | None:
        return f"{self.archive.rstrip('/')}/{name}" if self.archive else None


def options(beam_args: Sequence[str], streaming: bool) -> PipelineOptions:
    opts = PipelineOptions(list(beam_args))
    standard = opts.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = "FnApiRunner"  # DirectRunner would try to download Prism
    standard.streaming = streaming or standard.streaming
    return opts


def _assemble_and_write(events: Any, out: Outputs, lateness_s: float) -> None:
    assembled = events | "AssembleEpisodes" >> AssembleEpisodes(lateness_s)
    assembled.episodes | "WriteEpisodes" >> WriteEpisodes(
        out.log_url, out.sub("episodes"), EPISODES_TOPIC
    )
    assembled[DEAD_LETTER] | "WriteDeadLetters" >> WriteEpisodes(
        out.log_url, out.sub("deadletter"), DEAD_LETTER_TOPIC
    )


def run_streaming(
    source_url: str,
    out: Outputs,
    beam_args: Sequence[str] = (),
    allowed_lateness_s: float = 600.0,
    stop_when_idle_s: float | None = None,
) -> None:
    """Assemble episodes from the event log as events arrive."""
    with beam.Pipeline(options=options(beam_args, streaming=True)) as p:
        events = p | "ReadEvents" >> ReadEventLog(source_url, EVENTS_TOPIC, stop_when_idle_s)
        _assemble_and_write(events, out, allowed_lateness_s)


def run_replay(
    archive: str, out: Outputs, beam_args: Sequence[str] = (), allowed_lateness_s: float = 600.0
) -> None:
    """Rebuild every episode from a Parquet archive of events (batch)."""
    with beam.Pipeline(options=options(beam_args, streaming=False)) as p:
        events = p | "ReadArchive" >> ReadArchive(archive)
        _assemble_and_write(events, out, allowed_lateness_s)
