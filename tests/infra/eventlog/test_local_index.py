"""The local log's sparse offset index finds every offset's entry, in any order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.eventlog.local import LocalLog
from infra.eventlog.local_format import read_entries
from infra.eventlog.local_index import OffsetIndex
from schemas.errors import EventLogCorrupt

N = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("log")
    with LocalLog(root).writer() as writer:
        for i in range(N):
            writer.append("t", None if i % 5 == 0 else b"k", b"x" * (i * 7 % 23))
    return root / "t" / "data.log"


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(0, N), max_size=12))
def test_locate_matches_a_full_scan(data: Path, every: int, offsets: list[int]) -> None:
    with open(data, "rb") as f:
        entries, _ = read_entries(f, 0, N + 1)
        starts = [e.start for e in entries] + [entries[-1].end]
        index = OffsetIndex(every)
        for offset in offsets:
            assert index.locate(f, offset) == starts[offset]
        assert index.extend(f) == (N, starts[N])
        index.read(entries[:3], 3, starts[3])  # a read that stopped at 3: the hint
        assert index.locate(f, 3) == starts[3]


def test_offsets_outside_the_file_are_corrupt(data: Path) -> None:
    with open(data, "rb") as f:
        index = OffsetIndex(4)
        with pytest.raises(EventLogCorrupt, match=f"offset {N + 1} is outside"):
            index.locate(f, N + 1)
        with pytest.raises(EventLogCorrupt, match="offset -1 is outside"):
            index.locate(f, -1)
