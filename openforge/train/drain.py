"""What a training run waits for before it stops its pipeline: every verified rollout's episode
in the log, and every event the log holds in the run's archive (what replay, the query views
and the audit read). A pipeline stopped as soon as the last episode shows can still hold the
last events in an unwritten bundle: the last evaluation's ``verified`` phases, say, written
after its rewards."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from infra.eventlog import EPISODES_TOPIC, EVENTS_TOPIC, open_reader, records_in
from schemas.archive import archive_files
from schemas.codec import decode_message
from schemas.episode import Episode

EVENT_RECORDS = ("completion", "rollout", "reward")  # what the events topic holds


def wait_for_episodes(log_url: str, wanted: set[str], group: str, deadline: float) -> set[str]:
    """Wait until each rollout in ``wanted`` has an episode in the log (or the deadline); the
    rollouts still without one."""
    wanted = set(wanted)
    with open_reader(log_url, [EPISODES_TOPIC], group) as reader:
        while wanted and time.monotonic() < deadline:
            for rec in reader.poll(10_000, 1.0):
                for e in decode_message(rec.value):
                    if isinstance(e, Episode):
                        wanted.discard(e.rollout_id)
    return wanted


def wait_archived(log_url: str, archive: Path, deadline: float) -> int:
    """Wait until the archive holds every event the log's events topic holds now (or the
    deadline); how many it still lacks."""
    missing = {r.event_id for r in records_in(log_url, EVENTS_TOPIC)}  # type: ignore[union-attr]
    read: set[Path] = set()
    while missing:
        for name in EVENT_RECORDS:
            for path in archive_files(archive, name):
                if path not in read:
                    read.add(path)
                    missing -= set(
                        pq.read_table(path, columns=["event_id"])["event_id"].to_pylist()
                    )
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return len(missing)


def drain(
    log_url: str, archive: Path, wanted: set[str], group: str, timeout: float,
    say: Callable[[str], None],
) -> None:  # fmt: skip
    """Both waits, sharing ``timeout``; what is still missing at the end is said."""
    deadline = time.monotonic() + timeout
    left = wait_for_episodes(log_url, wanted, group, deadline)
    if left:
        say(f"[yellow]{len(left)} rollouts had no episode yet when the run ended[/]")
    unarchived = wait_archived(log_url, archive, deadline)
    if unarchived:
        say(f"[yellow]{unarchived} events were not archived yet when the run ended[/]")
