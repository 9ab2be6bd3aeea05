"""One contract, both event logs: the embedded local log and a real Kafka broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.eventlog import EventLogReader, LogRecord, open_reader, open_writer
from infra.local.kafka import KafkaBroker


@pytest.fixture(params=["local", "kafka"])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield f"local:{tmp_path / 'log'}"
    else:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        yield broker.url


def _drain(reader: EventLogReader, want: int, timeout: float = 20.0) -> list[LogRecord]:
    out: list[LogRecord] = []
    import time

    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += reader.poll(max_records=want - len(out), timeout=0.5)
    return out


def test_append_read_commit_resume(log_url: str) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    with open_writer(log_url) as writer:
        for i in range(300):
            writer.append(topic, f"r{i % 7}".encode(), f"v{i}".encode())
        writer.append(topic, None, b"no key")
        writer.flush()

    with open_reader(log_url, [topic], group="g1") as reader:
        first = _drain(reader, 120)
        reader.commit()
    assert [r.value for r in first] == [f"v{i}".encode() for i in range(120)]
    assert [r.offset for r in first] == list(range(120))
    assert first[5].key == b"r5"

    with open_reader(log_url, [topic], group="g1") as reader:
        rest = _drain(reader, 181)
        reader.commit()
    assert [r.offset for r in rest] == list(range(120, 301))
    assert rest[-1].key is None and rest[-1].value == b"no key"

    # Another group reads everything from the beginning; a late-joining group can start at the end.
    with open_reader(log_url, [topic], group="g2") as reader:
        assert len(_drain(reader, 301)) == 301
    with open_reader(log_url, [topic], group="g3", from_beginning=False) as reader:
        assert reader.poll(timeout=1.0) == []


def test_commit_an_earlier_position_to_read_records_again(log_url: str) -> None:
    """A consumer that polled ahead commits the first record it has not finished with."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    with open_writer(log_url) as writer:
        for i in range(20):
            writer.append(topic, b"k", f"v{i}".encode())
        writer.flush()
    with open_reader(log_url, [topic], group="g") as reader:
        assert len(_drain(reader, 12)) == 12
        reader.commit({(topic, 0): 5})
    with open_reader(log_url, [topic], group="g") as reader:
        again = _drain(reader, 15)
    assert [r.offset for r in again] == list(range(5, 20))
