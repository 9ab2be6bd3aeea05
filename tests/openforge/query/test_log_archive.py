"""A run's embedded event log archived for the queries (``openforge rollouts run`` does it once
its rollouts have ended): every event, of every type, once; a damaged frame is left out and
counted, never stops the others; archiving again replaces the archive, never doubles it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.eventlog import EVENTS_TOPIC, open_writer
from openforge.query.log_archive import archive_log
from openforge.query.views import open_views
from openforge.testing.rollouts import make_rollout
from schemas.archive import read_archive
from schemas.codec import encode_message
from schemas.completion import CompletionEvent
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent


@given(
    seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=3, unique=True),
    damaged=st.integers(0, 2),
)
@settings(max_examples=10, deadline=None)
def test_every_event_is_archived_once_and_a_damaged_frame_is_counted(
    tmp_path_factory: pytest.TempPathFactory, seeds: list[int], damaged: int
) -> None:
    tmp = tmp_path_factory.mktemp("log")
    url = f"local:{tmp / 'log'}"
    records = [r for s in seeds for r in make_rollout(s, f"r{s}", calls=4).records]
    with open_writer(url) as w:
        for i, record in enumerate(records):
            w.append(EVENTS_TOPIC, record.rollout_id.encode(), encode_message([record]))
            if i < damaged:
                w.append(EVENTS_TOPIC, b"x", b"not a frame")
        w.flush()
    for _ in range(2):  # again: the archive is replaced, not doubled
        assert archive_log(url, tmp / "run" / "archive") == (
            len(records),
            min(damaged, len(records)),
        )
    for cls in (CompletionEvent, RolloutEvent, RewardEvent):
        got = Counter(e.event_id for e in read_archive(tmp / "run" / "archive", cls))
        assert got == Counter(r.event_id for r in records if isinstance(r, cls)), cls
    calls = sum(isinstance(r, CompletionEvent) for r in records)
    rows = open_views(run=tmp / "run").sql("SELECT count(*) FROM raw.completion").fetchall()
    assert rows == [(calls,)]  # what `openforge query --run` reads
