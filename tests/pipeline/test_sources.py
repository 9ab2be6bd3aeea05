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


def test_a_kafka_topic_of_four_partitions_is_read_whole_each_keys_records_in_order(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """``kafka://...?partitions=4``: the topics OpenForge creates get four partitions; records
    keyed by rollout land across them, and the source reads every partition, each key's
    records in the order written (what the per-rollout assembly needs)."""
    from infra.eventlog import create_topics, open_reader

    url = f"{kafka_broker.url}?partitions=4"
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_topics(url, [topic])
    with open_reader(kafka_broker.url, [topic], group=f"g-{topic}") as reader:
        assert reader.partitions(topic, timeout=30.0) == [0, 1, 2, 3]
    _append(url, topic, 0, 60)
    out = tmp_path / "out.txt"
    with beam.Pipeline(options=options(["--runner=FnApiRunner"], streaming=True)) as p:
        (
            p
            | ReadEventLog(url, topic, stop_when_idle_s=3, records_per_call=7)
            | beam.ParDo(_AppendTo(str(out)))
        )
    lines = out.read_text().splitlines()
    assert sorted(lines) == sorted(f"r{i % 3} v{i}" for i in range(60))
    for key in ("r0", "r1", "r2"):
        mine = [int(line.split()[1][1:]) for line in lines if line.startswith(f"{key} ")]
        assert mine == sorted(mine) and len(mine) == 20
