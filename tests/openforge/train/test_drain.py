"""What a run waits for before it stops its pipeline (openforge.train.drain): every event of the
log in the archive, however the archive's files were cut, and no longer than the deadline."""

from __future__ import annotations

import time
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, open_writer
from openforge.testing.rollouts import make_rollout
from openforge.train.drain import wait_archived
from schemas.archive import ArchiveWriter
from schemas.codec import encode_message


def test_the_wait_ends_once_every_event_of_the_log_is_archived(tmp_path: Path) -> None:
    url, archive = f"local:{tmp_path / 'log'}", tmp_path / "archive"
    records = [r for i in range(3) for r in make_rollout(i, f"r{i}", calls=2).records]
    with open_writer(url) as writer:
        for record in records:
            writer.append(EVENTS_TOPIC, record.rollout_id.encode(), encode_message([record]))
    ArchiveWriter(archive).write(records[:-1])  # the last event not archived yet
    started = time.monotonic()
    assert wait_archived(url, archive, deadline=started + 1.0) == 1
    assert time.monotonic() - started >= 1.0  # it waited for it, until the deadline
    ArchiveWriter(archive).write(records[-1:])
    assert wait_archived(url, archive, deadline=time.monotonic() + 30) == 0
