"""The local log's own guarantees: concurrent writers, torn tails, corruption."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from infra.eventlog.local import LocalLog
from schemas.errors import EventLogError


def _write_many(root: str, tag: str, n: int) -> None:
    with LocalLog(Path(root)).writer() as writer:
        for i in range(n):
            writer.append("t", tag.encode(), f"{tag}{i}".encode())


def test_concurrent_writer_processes_get_distinct_offsets(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), tag, 200)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = LocalLog(tmp_path).reader(["t"], "g").poll(max_records=1000, timeout=0.1)
    assert [r.offset for r in records] == list(range(400))
    for tag in "ab":  # each writer's records stay in its own order
        mine = [r.value.decode() for r in records if r.key == tag.encode()]
        assert mine == [f"{tag}{i}" for i in range(200)]
    assert LocalLog(tmp_path).end_offset("t") == 400


def test_torn_tail_is_read_once_complete(tmp_path: Path) -> None:
    with LocalLog(tmp_path).writer() as writer:
        writer.append("t", b"k", b"complete")
    data = tmp_path / "t" / "data.log"
    whole = data.read_bytes()
    reader = LocalLog(tmp_path).reader(["t"], "g")
    data.write_bytes(whole + whole[:10])  # a writer mid-append
    assert [r.value for r in reader.poll(timeout=0.1)] == [b"complete"]
    assert reader.poll(timeout=0.1) == []


def test_corruption_is_reported_with_its_offset(tmp_path: Path) -> None:
    with LocalLog(tmp_path).writer() as writer:
        writer.append("t", None, b"hello world")
    data = tmp_path / "t" / "data.log"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(EventLogError, match="corrupt at offset 0"):
        LocalLog(tmp_path).reader(["t"], "g").poll(timeout=0.1)


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EventLogError, match="invalid topic"):
        LocalLog(tmp_path).writer().append("../x", None, b"")
    with pytest.raises(EventLogError, match="invalid consumer group"):
        LocalLog(tmp_path).reader(["t"], "a/b")


def _write_then_die(root: str, n: int) -> None:
    import os
    import signal

    writer = LocalLog(Path(root)).writer(fsync=False)
    for i in range(n):
        writer.append("t", b"k", f"r{i}".encode())
    writer.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no exit handlers


def test_a_flush_without_fsync_survives_the_writers_crash(tmp_path: Path) -> None:
    """``fsync=False`` hands flushed records to the OS: a killed writer loses none of them."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_write_then_die, args=(str(tmp_path), 300))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    records = LocalLog(tmp_path).reader(["t"], "g").poll(max_records=1000, timeout=0.1)
    assert [r.value.decode() for r in records] == [f"r{i}" for i in range(300)]
