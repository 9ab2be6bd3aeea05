"""One contract, both event logs: the embedded local log and a real Kafka broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.eventlog import (
    EventLogReader,
    LogRecord,
    PartitionBatch,
    create_topics,
    open_reader,
    open_writer,
)
from infra.local.kafka import KafkaBroker
from infra.local.process import free_port
from schemas.errors import ConfigError, EventLogCorrupt, EventLogUnavailable


@pytest.fixture(params=["local", "kafka"])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield f"local:{tmp_path / 'log'}"
    else:
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        yield broker.url


def _drain(reader: EventLogReader, want: int, timeout: float = 20.0) -> list[LogRecord]:
    out: list[LogRecord] = []
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


def test_a_reader_started_before_the_first_record_finds_its_topic_and_then_the_record(
    log_url: str,
) -> None:
    """A streaming job may start before the proxy's first event: its topics are created, so
    its partition reader finds them at once (it waited 30 s, then failed, on an absent Kafka
    topic) and its group reader gets what is appended later."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_topics(log_url, [topic])
    create_topics(log_url, [topic])  # again: nothing to do
    with open_reader(log_url) as reader:
        assert reader.partitions(topic, timeout=1.0) == [0]
        assert reader.end_offset(topic, 0) == 0
    with open_reader(log_url, [topic], group="early") as reader:
        assert reader.poll(timeout=0.5) == []
        with open_writer(log_url) as writer:
            writer.append(topic, b"k", b"first")
            writer.flush()
        assert [r.value for r in _drain(reader, 1)] == [b"first"]


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


# --- partition reads by record offset ------------------------------------------------------------


def _write(url: str, topic: str, start: int, n: int) -> None:
    with open_writer(url) as writer:
        for i in range(start, start + n):
            writer.append(topic, f"k{i}".encode(), f"v{i}".encode())
        writer.flush()


def _first_batch(reader: EventLogReader, topic: str, offset: int, n: int) -> PartitionBatch:
    """The first read that returns records (Kafka may need a poll or two to fetch)."""
    deadline = time.monotonic() + 20
    while True:
        batch = reader.read(topic, 0, offset, max_records=n, timeout=0.5)
        if batch.records or time.monotonic() > deadline:
            return batch


def test_partition_reads_from_any_record_offset(log_url: str) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    _write(log_url, topic, 0, 50)
    with open_reader(log_url) as reader:
        assert reader.partitions(topic) == [0]
        assert reader.end_offset(topic, 0) == 50
        for offset in (0, 37, 1, 49, 20):  # forwards and backwards
            batch = _first_batch(reader, topic, offset, 5)
            assert batch.records, offset
            first = batch.records[0]
            assert (first.offset, first.key, first.value) == (
                offset,
                f"k{offset}".encode(),
                f"v{offset}".encode(),
            )
            assert [r.offset for r in batch.records] == list(range(offset, batch.next_offset))
            assert len(batch.records) <= 5 and batch.end_offset == 50
            assert batch.caught_up == (batch.next_offset == 50)
        every: list[int] = []
        offset = 0
        while offset < 50:
            batch = _first_batch(reader, topic, offset, 1000)
            every += [r.offset for r in batch.records]
            offset = batch.next_offset
        assert every == list(range(50)) and batch.caught_up

        at_end = reader.read(topic, 0, 50, timeout=0.3)
        assert (at_end.records, at_end.next_offset, at_end.end_offset) == ((), 50, 50)
        assert at_end.caught_up

        _write(log_url, topic, 50, 3)  # the end moves, and the read from the old end sees it
        later = _first_batch(reader, topic, 50, 10)
        assert [r.value for r in later.records] == [b"v50", b"v51", b"v52"]
        assert later.caught_up and reader.end_offset(topic, 0) == 53


def test_partition_reads_leave_group_positions_alone(log_url: str) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    _write(log_url, topic, 0, 10)
    with open_reader(log_url, [topic], group="g") as reader:
        assert [r.offset for r in _drain(reader, 4)] == [0, 1, 2, 3]
        assert _first_batch(reader, topic, 8, 10).records[0].offset == 8
        reader.commit()
    with open_reader(log_url, [topic], group="g") as reader:
        assert [r.offset for r in _drain(reader, 6)] == list(range(4, 10))


def test_an_offset_past_the_end_is_refused_as_corrupt(log_url: str) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    _write(log_url, topic, 0, 5)
    with (
        open_reader(log_url) as reader,
        pytest.raises(EventLogCorrupt, match="offset 6 is outside"),
    ):
        reader.read(topic, 0, 6, timeout=0.2)


def test_polling_needs_a_group(log_url: str) -> None:
    with pytest.raises(ConfigError, match="needs a consumer group"):
        open_reader(log_url, ["t"])
    with open_reader(log_url) as reader, pytest.raises(ConfigError, match="no consumer group"):
        reader.poll(timeout=0.1)


# --- error classes -------------------------------------------------------------------------------


def test_an_unreachable_kafka_is_unavailable() -> None:
    url = f"kafka://127.0.0.1:{free_port()}"
    fast = {"bootstrap_timeout_ms": 1000}  # kafka-python waits 30 s by default
    with pytest.raises(EventLogUnavailable, match="cannot connect a producer"):
        open_writer(url, **fast)
    with pytest.raises(EventLogUnavailable, match="cannot connect a consumer"):
        open_reader(url, ["t"], group="g", **fast)
    with open_reader(url, **fast) as reader, pytest.raises(EventLogUnavailable):
        reader.partitions("t", timeout=1.0)


def test_a_local_log_on_a_broken_disk_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(EventLogUnavailable, match="check the disk"):
        open_writer(f"local:{tmp_path / 'file' / 'log'}")
    with open_writer(f"local:{tmp_path / 'log'}") as writer:
        (tmp_path / "log" / "t").write_text("a file where the topic directory goes")
        with pytest.raises(EventLogUnavailable):
            writer.append("t", None, b"x")


def test_a_corrupted_local_file_is_corrupt_not_unavailable(tmp_path: Path) -> None:
    url = f"local:{tmp_path / 'log'}"
    _write(url, "t", 0, 3)
    data = tmp_path / "log" / "t" / "data.log"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # the last record's payload
    data.write_bytes(bytes(raw))
    with open_reader(url) as reader:
        assert [r.offset for r in reader.read("t", 0, 0, max_records=2).records] == [0, 1]
        with pytest.raises(EventLogCorrupt, match="corrupt at offset 2") as caught:
            reader.read("t", 0, 2)
        assert not isinstance(caught.value, EventLogUnavailable)
    with open_reader(url, ["t"], group="g") as reader, pytest.raises(EventLogCorrupt):
        reader.poll(timeout=0.1)
