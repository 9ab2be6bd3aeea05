"""ReadEventLog on Prism and on FnApiRunner: every record exactly once, in offset order, across
the checkpoints between reads (positions are record offsets), from the local log and from Kafka."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import pytest

from infra.eventlog import open_writer
from infra.local.kafka import KafkaBroker
from pipeline.jobs import options
from pipeline.sources import ReadEventLog


class _AppendTo(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, element: tuple[str, bytes]) -> Iterator[None]:
        with open(self.path, "a") as f:
            f.write(f"{element[0]} {element[1].decode()}\n")
        yield from ()


@pytest.fixture
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield f"local:{tmp_path / 'log'}"
    else:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        yield broker.url


def _append(url: str, topic: str, start: int, n: int) -> None:
    with open_writer(url) as writer:
        for i in range(start, start + n):
            writer.append(topic, f"r{i % 3}".encode(), f"v{i}".encode())
        writer.flush()


# Kafka on the default runner is read by tests/pipeline/test_jobs.py's end-to-end test and the
# Kafka training run (tests/openforge/train), so that fourth pairing is not repeated here.
@pytest.mark.parametrize(
    ("log_url", "runner"),
    [("local", "PrismRunner"), ("kafka", "PrismRunner"), ("local", "FnApiRunner")],
    indirect=["log_url"],
)
def test_every_record_once_in_order_across_checkpoints(
    log_url: str, tmp_path: Path, runner: str
) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    _append(log_url, topic, 0, 40)
    later = threading.Timer(1.5, _append, (log_url, topic, 40, 25))  # while the read runs
    later.start()
    out = tmp_path / "out.txt"
    started = time.monotonic()
    with beam.Pipeline(
        options=options([f"--runner={runner}"], streaming=True, runner_splits=True)
    ) as p:
        (
            p
            | ReadEventLog(log_url, topic, stop_when_idle_s=3, records_per_call=7)
            | beam.ParDo(_AppendTo(str(out)))
        )
    later.join()
    lines = out.read_text().splitlines()
    assert lines == [f"r{i % 3} v{i}" for i in range(65)]
    assert time.monotonic() - started < 120
