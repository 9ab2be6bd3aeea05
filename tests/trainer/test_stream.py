"""The episode stream's batching by whole groups and its training-task filter, on a local log."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, open_writer
from schemas.codec import encode_message
from schemas.completion import PolicySpan
from schemas.episode import SUPERSEDED, Episode, Sample
from schemas.errors import ConfigError
from trainer.stream import EpisodeSource, EpisodeStream, StreamConfig


def _episode(i: int, task: str, group: str) -> Episode:
    tokens = list(range(10, 30))
    mask = [0] * 10 + [1] * 10
    return Episode(
        f"ep{i:03d}",
        f"r{i}",
        [Sample(0, tokens, mask, [-1.0 if m else 0.0 for m in mask], [PolicySpan(0, 10, 20)])],
        1.0,
        0,
        task_id=task,
        group_id=group,
    )


def _write(url: str, episodes: list[Episode], topic: str = EPISODES_TOPIC) -> None:
    with open_writer(url) as w:
        for e in episodes:
            w.append(topic, e.rollout_id.encode(), encode_message([e]))
        w.flush()


def _drain(stream: EpisodeStream) -> list[list[Episode]]:
    batches = []
    for _ in range(5):
        while (batch := stream.next_batch(0, timeout=0.2)) is not None:
            batches.append(batch)
    return batches


def test_a_batch_is_exactly_the_groups_of_one_round(tmp_path: Path) -> None:
    url = f"local:{tmp_path / 'log'}"
    # Five groups of two ready at once: batches of exactly two groups, the fifth group waits.
    _write(url, [_episode(i, f"t{i // 2}", f"g{i // 2}") for i in range(10)])
    stream = EpisodeStream(EpisodeSource(url, "g"), StreamConfig(group_size=2, groups_per_batch=2))
    batches = _drain(stream)
    assert [len(b) for b in batches] == [4, 4]
    assert stream.pending() == 2  # the fifth group, held until a second group joins it


def test_only_training_tasks_are_trained_on(tmp_path: Path) -> None:
    url = f"local:{tmp_path / 'log'}"
    _write(url, [_episode(i, "train-a" if i < 4 else "heldout-b", f"g{i // 2}") for i in range(8)])
    config = StreamConfig(group_size=2, task_ids=frozenset({"train-a"}))
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    trained = [e for b in _drain(stream) for e in b]
    assert {e.task_id for e in trained} == {"train-a"} and len(trained) == 4
    assert stream.stats.not_trained_task == 4  # counted, not silently dropped


def test_groups_per_batch_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="groups_per_batch"):
        StreamConfig(groups_per_batch=0)


def test_an_incomplete_group_times_out_and_stops_holding_back_the_position(
    tmp_path: Path,
) -> None:
    """Three of a group of four arrive (the fourth rollout was dead-lettered), and one episode
    of another group: after ``group_timeout_s`` the three are trained as a smaller group, the
    lone one is counted, and the committed position moves past all of them."""
    import time

    url = f"local:{tmp_path / 'log'}"
    _write(url, [_episode(i, "a", "ga") for i in range(3)] + [_episode(3, "b", "gb")])
    config = StreamConfig(group_size=4, group_timeout_s=0.5)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    assert stream.next_batch(0, timeout=0.2) is None  # both groups wait
    stream.commit()
    again = EpisodeStream(EpisodeSource(url, "g"), config)  # the position is pinned: all of
    assert again.next_batch(0, timeout=0.2) is None and again.pending() == 4  # them again
    time.sleep(0.6)
    batch = stream.next_batch(0, timeout=0.2)
    assert batch is not None and sorted(e.episode_id for e in batch) == ["ep000", "ep001", "ep002"]
    assert (stream.stats.partial_groups, stream.stats.timed_out_alone) == (1, 1)
    stream.trained(batch)
    stream.commit()
    after = EpisodeStream(EpisodeSource(url, "g"), config)
    assert after.next_batch(0, timeout=0.2) is None and after.pending() == 0  # released


def test_group_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="group_timeout_s"):
        StreamConfig(group_timeout_s=0)


def test_a_backlog_admitted_at_one_version_is_dropped_once_it_is_too_stale_to_train(
    tmp_path: Path,
) -> None:
    """Six groups of one, all of version 0, admitted at version 0 (a restarted trainer reading
    its backlog); one group a batch. As the version moves on, a group more than
    ``max_staleness`` behind when its batch is formed is dropped and counted, not trained, and
    the committed position moves past it."""
    url = f"local:{tmp_path / 'log'}"
    _write(url, [_episode(i, f"t{i}", f"g{i}") for i in range(6)])
    config = StreamConfig(group_size=1, groups_per_batch=1, max_staleness=2)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    trained = []
    for version in range(6):  # one update a version
        batch = stream.next_batch(version, timeout=0.2)
        if batch is not None:
            trained += [e.episode_id for e in batch]
            stream.trained(batch)
    assert trained == ["ep000", "ep001", "ep002"]  # at lags 0, 1 and 2
    assert stream.stats.stale_dropped == 3 and stream.pending() == 0
    stream.commit()
    again = EpisodeStream(EpisodeSource(url, "g"), config)
    assert again.next_batch(5, timeout=0.2) is None and again.pending() == 0


def test_a_dead_lettered_member_completes_its_group_without_waiting(tmp_path: Path) -> None:
    """A rollout of a group of four timed out before its first answer: its episode is a dead
    letter. The other three are trained at once as a smaller group (not after group_timeout_s),
    and a group whose other members were all lost releases its one episode, counted."""
    url = f"local:{tmp_path / 'log'}"
    dead = [replace(_episode(9, "a", "ga"), dead_letter="rollout timed out before any call")]
    dead += [replace(_episode(10 + i, "b", "gb"), dead_letter="no calls") for i in range(3)]
    _write(url, dead, DEAD_LETTER_TOPIC)
    _write(url, [_episode(i, "a", "ga") for i in range(3)] + [_episode(3, "b", "gb")])
    config = StreamConfig(group_size=4, group_timeout_s=3600)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    batches = _drain(stream)
    assert [sorted(e.episode_id for e in b) for b in batches] == [["ep000", "ep001", "ep002"]]
    stats = stream.stats
    assert (stats.dead_letters, stats.lost_members, stats.partial_groups) == (4, 4, 1)
    assert (stats.short_alone, stats.timed_out_alone) == (1, 0)
    assert stream.pending() == 0
    stream.trained(batches[0])
    stream.commit()  # the dead letters' reader moves on too: a restart reads none again
    after = EpisodeStream(EpisodeSource(url, "g"), config)
    assert after.next_batch(0, timeout=0.2) is None and after.stats.read == 0


def test_an_attempt_played_again_is_not_a_lost_member_its_retry_is_the_member(
    tmp_path: Path,
) -> None:
    """One rollout of a group of four failed to register (the proxy hung up) and was played
    again as a new attempt: the failed attempt's dead letter says so. The group waits for the
    retry instead of training the other three without it (the retry's episode came after the
    group had been released, and was never trained on: a CI run trained 15 of 16)."""
    url = f"local:{tmp_path / 'log'}"
    failed = replace(_episode(9, "a", "ga"), dead_letter=f"{SUPERSEDED}: cannot register")
    _write(url, [failed], DEAD_LETTER_TOPIC)
    _write(url, [_episode(i, "a", "ga") for i in range(3)])
    config = StreamConfig(group_size=4, group_timeout_s=3600)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    assert _drain(stream) == []  # three of four members: the retry is still to come
    _write(url, [_episode(3, "a", "ga")])  # the retry's episode
    (batch,) = _drain(stream)
    assert sorted(e.episode_id for e in batch) == ["ep000", "ep001", "ep002", "ep003"]
    stats = stream.stats
    assert (stats.dead_letters, stats.superseded, stats.lost_members) == (1, 1, 0)
    assert stats.partial_groups == 0 and stream.pending() == 0


@given(
    order=st.permutations(list(range(4))),
    lost=st.sets(st.integers(0, 3), max_size=4),
)
@settings(max_examples=30, deadline=None)
def test_a_group_is_released_once_its_members_came_or_were_lost_in_any_order(
    tmp_path_factory: pytest.TempPathFactory, order: list[int], lost: set[int]
) -> None:
    url = f"local:{tmp_path_factory.mktemp('log')}"
    config = StreamConfig(group_size=4, group_timeout_s=3600)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    for i in order:  # one member at a time, as they end
        episode = _episode(i, "a", "ga")
        if i in lost:
            _write(url, [replace(episode, dead_letter="lost")], DEAD_LETTER_TOPIC)
        else:
            _write(url, [episode])
        batch = stream.next_batch(0, timeout=0.05)
        done = i == order[-1]
        came = 4 - len(lost)
        if done and came >= 2:  # at once: the last member (come or lost) completes it
            assert batch is not None and len(batch) == came
        else:
            assert batch is None
    assert stream.pending() == 0  # released: trained (two or more came) or counted alone
    assert stream.stats.lost_members == len(lost)


def test_a_round_whose_group_has_no_signal_still_ends_as_an_empty_batch(tmp_path: Path) -> None:
    """Paced by rounds (one group per batch), a group whose members were all lost (both
    rollouts killed mid-call: dead letters), or all but one, still ends its round: the batch is
    empty (the update is skipped) instead of never coming, which would stall the run's driver
    waiting for that update."""
    url = f"local:{tmp_path / 'log'}"
    lost = [replace(_episode(i, "a", "ga"), dead_letter="no trainable call") for i in range(2)]
    _write(url, [*lost, replace(_episode(2, "b", "gb"), dead_letter="no trainable call")])
    _write(url, [_episode(3, "b", "gb")])  # group b: one trainable member, alone
    config = StreamConfig(group_size=2, groups_per_batch=1, group_timeout_s=3600)
    stream = EpisodeStream(EpisodeSource(url, "g"), config)
    assert _drain(stream) == [[], []]  # two rounds, nothing to train in either
    assert (stream.stats.empty_groups, stream.stats.short_alone) == (2, 1)
    assert stream.pending() == 0
