"""The one schedule of syncs, checkpoints and policy versions, against the rules the lead and the
other ranks each followed before they shared it, and with the durable version ledger."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.errors import ConfigError
from trainer.checkpoint import PolicyVersions
from trainer.schedule import Schedule

Trace = list[tuple[int, bool, bool, int]]  # (step, synced, checkpointed, version after it)


def _old_lead(
    sync_every: int | None, ckpt_every: int, step: int, version: int, high: int, n: int
) -> Trace:
    """The lead's old rules: resume above the highest version handed out; at a sync, the next
    version above both the current one and every one handed out."""
    version = max(version, high)
    out: Trace = []
    for _ in range(n):
        step += 1
        synced = sync_every is not None and step % sync_every == 0
        if synced:
            version = max(version, high) + 1
            high = version
        out.append((step, synced, step % ckpt_every == 0, version))
    return out


def _old_follower(
    sync_every: int | None, ckpt_every: int, step: int, version: int, n: int
) -> Trace:
    """The other ranks' old rules: the checkpoint's version, plus one per sync."""
    out: Trace = []
    for _ in range(n):
        step += 1
        synced = sync_every is not None and step % sync_every == 0
        version += synced
        out.append((step, synced, step % ckpt_every == 0, version))
    return out


def _new(schedule: Schedule, step: int, version: int, n: int) -> Trace:
    out: Trace = []
    for _ in range(n):
        step += 1
        due = schedule.after(step, version)
        version = due.version
        out.append((step, due.sync, due.checkpoint, version))
    return out


@given(
    sync_every=st.none() | st.integers(1, 5),
    ckpt_every=st.integers(1, 5),
    step=st.integers(0, 30),
    version=st.integers(0, 30),
    high=st.integers(0, 40),
    n=st.integers(0, 30),
)
def test_the_schedule_follows_the_old_rules_of_every_rank(
    sync_every: int | None, ckpt_every: int, step: int, version: int, high: int, n: int
) -> None:
    schedule = Schedule(sync_every, ckpt_every)
    start = max(version, high)  # what the lead resumes from, and hands the other ranks
    new = _new(schedule, step, start, n)
    assert new == _old_lead(sync_every, ckpt_every, step, version, high, n)
    if high <= version:  # the old rules of the other ranks differed only after a lost sync
        assert new == _old_follower(sync_every, ckpt_every, step, version, n)


@given(
    sync_every=st.integers(1, 4),
    crashes=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), max_size=4),
)
def test_versions_handed_out_strictly_increase_across_resumes(
    sync_every: int, crashes: list[tuple[int, int]]
) -> None:
    """Each launch runs some updates and loses the last ``lost`` of them (the checkpoint is
    older than the last sync): the ledger never hands a version out twice."""
    schedule = Schedule(sync_every, 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "versions.jsonl"
        step, version = 0, 0  # the checkpoint's
        for updates, lost in crashes:
            ledger = PolicyVersions(path)
            current = max(version, ledger.high_water())
            kept = (step, version)
            for i in range(updates):
                due = schedule.after(step + 1, current)
                step, current = step + 1, due.version
                if due.sync:
                    ledger.record(step, due.version)
                if i < updates - lost:
                    kept = (step, current)
            step, version = kept
        lines = path.read_text().splitlines() if path.exists() else []
        versions = [json.loads(line)["version"] for line in lines]
        assert versions == sorted(set(versions))


def test_a_version_is_never_recorded_twice(tmp_path: Path) -> None:
    ledger = PolicyVersions(tmp_path / "versions.jsonl")
    ledger.record(1, 1)
    with pytest.raises(ValueError, match="not above 1"):
        PolicyVersions(tmp_path / "versions.jsonl").record(2, 1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Schedule(sync_every=0), "sync_every must be at least 1"),
        (lambda: Schedule(checkpoint_every=0), "checkpoint_every must be at least 1"),
    ],
)
def test_bad_intervals_are_config_errors(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]
