"""The episode stream: finished episodes in, training batches out.

Reads the ``episodes`` topic of the event log (Kafka or local, as a consumer group) or a Parquet
archive, and the dead letters beside it; drops duplicates (same episode id) and counts dead
letters; applies staleness admission control; groups episodes by task so group-relative
advantages compare like with like; and cuts batches by token budget. Every decision is counted,
nothing is dropped silently.

A group member that will never be trained on (dead-lettered, e.g. a rollout that timed out
before its first answer; empty; or dropped as stale) counts toward its group: once the members
that came and those lost make the group's size, it is released at once, as a smaller group if
two or more came (``partial_groups``), instead of waiting ``group_timeout_s`` for a member that
cannot come.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from infra.eventlog import (
    DEAD_LETTER_TOPIC,
    EPISODES_TOPIC,
    EventLogReader,
    LogKind,
    open_reader,
    parse_url,
)
from schemas.archive import read_archive
from schemas.codec import decode_message
from schemas.episode import Episode, superseded
from schemas.errors import ConfigError
from schemas.registry import choose
from trainer.batch import group_key

Position = tuple[tuple[str, int], int]  # ((topic, partition), offset)


class Admission(StrEnum):
    """What became of an episode read from the stream."""

    ADMITTED = "admitted"
    SKIPPED = "skipped"  # a duplicate, or another task's: no group is waiting for it
    LOST = "lost"  # a member its group waits for that will never be trained on


class StalePolicy(StrEnum):
    """What happens to an episode whose policy-version lag exceeds ``max_staleness``."""

    DROP = "drop"  # counted, not trained on
    KEEP = "keep"  # counted, trained on (importance sampling corrects it)


@dataclass(frozen=True)
class StreamConfig:
    """Attributes:
    group_size: episodes of one task per group (GRPO compares within a group); 1 disables.
    token_budget: tokens per batch (prompt and generated, all samples).
    max_staleness: the policy-version lag (current version - oldest version in the episode)
        allowed at admission and again when its batch is formed (a backlog admitted at one
        version trains over many updates).
    stale: what to do beyond it: ``drop`` (counted) or ``keep`` (counted, trained on).
    groups_per_batch: when set, a batch is exactly this many whole groups (the token budget
        still caps it), so an update consumes what one round of rollouts produced.
    task_ids: when set, only episodes of these tasks are trained on; others (a held-out split
        evaluated through the same proxy) are counted as ``not_trained_task`` and skipped.
    group_timeout_s: a group still short of ``group_size`` this long after its first episode
        (a rollout of it never ended in an episode or a dead letter) is released: trained as a
        smaller group if it has two or more episodes (``partial_groups``), else counted as
        ``timed_out_alone``; either way it stops holding back the committed stream position.
        None: wait forever. A group whose missing members are known lost (dead letters) does
        not wait for it.
    """

    group_size: int = 4
    token_budget: int = 16_384
    max_staleness: int = 4
    stale: StalePolicy = StalePolicy.DROP
    groups_per_batch: int | None = None
    task_ids: frozenset[str] | None = None
    group_timeout_s: float | None = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stale", choose(StalePolicy, self.stale, "stale policy"))
        if self.groups_per_batch is not None and self.groups_per_batch < 1:
            raise ConfigError(f"groups_per_batch must be at least 1, not {self.groups_per_batch}")
        if self.group_timeout_s is not None and self.group_timeout_s <= 0:
            raise ConfigError(
                f"group_timeout_s must be positive (or None to wait), not {self.group_timeout_s}"
            )


@dataclass
class StreamStats:
    read: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    stale_dropped: int = 0
    stale_kept: int = 0
    empty: int = 0
    not_trained_task: int = 0
    partial_groups: int = 0  # groups released short (members lost or timed out), trained on
    timed_out_alone: int = 0  # episodes released alone by group_timeout_s, not trained on
    lost_members: int = 0  # dead letters, empty and stale episodes counted toward their group
    short_alone: int = 0  # episodes whose group's other members were all lost, not trained on
    empty_groups: int = 0  # paced batches: groups with fewer than two trainable episodes
    superseded: int = 0  # dead letters of attempts played again: their retries are the members
    by_reason: Counter[str] = field(default_factory=Counter)


def policy_lag(episode: Episode, current_version: int) -> int:
    versions = [s.version for sample in episode.samples for s in sample.policy_versions]
    return current_version - min(versions) if versions else 0


class EpisodeSource:
    """Episodes from ``kafka://...``, ``local:DIR`` (consumer ``group``) or ``archive:DIR``."""

    def __init__(self, url: str, group: str = "openforge-trainer") -> None:
        self.url = url
        self._reader: EventLogReader | None = None
        self._dead: EventLogReader | None = None  # the dead letters, done with once read
        self._archive: Iterator[Episode] | None = None
        parsed = parse_url(url)
        if parsed.kind is LogKind.ARCHIVE:
            root = parsed.path
            if not root.exists():
                raise ConfigError(f"no archive at {root}")
            self._archive = read_archive(root, Episode)
        else:
            # A trainer killed without leaving its consumer group holds its partitions until its
            # session times out: the broker's shortest (6 s, not 10) lets a restarted one in.
            self._reader = open_reader(
                url, [EPISODES_TOPIC], group=group, session_timeout_ms=6000,
                heartbeat_interval_ms=2000,
            )  # fmt: skip
            self._dead = open_reader(
                url, [DEAD_LETTER_TOPIC], group=f"{group}.deadletters", session_timeout_ms=6000,
                heartbeat_interval_ms=2000,
            )  # fmt: skip

    def poll(self, timeout: float = 1.0) -> list[tuple[Episode, Position | None]]:
        """Episodes with their log position ((topic, partition), offset); None from archives."""
        if self._archive is not None:
            return [(e, None) for _, e in zip(range(256), self._archive, strict=False)]
        assert self._reader is not None and self._dead is not None
        read: list[tuple[Episode, Position | None]] = [
            (e, None)  # no position to keep: nothing waits to be trained on
            for rec in self._dead.poll(max_records=256, timeout=0)
            for e in decode_message(rec.value)
            if isinstance(e, Episode)
        ]
        return read + [
            (e, ((rec.topic, rec.partition), rec.offset))
            for rec in self._reader.poll(max_records=256, timeout=timeout)
            for e in decode_message(rec.value)
            if isinstance(e, Episode)
        ]

    def commit(self, pending: list[Position]) -> None:
        """Store the stream position, keeping episodes read but not yet trained on (``pending``)
        to be read again after a restart."""
        if self._reader is None:
            return
        if self._dead is not None:
            self._dead.commit()
        first: dict[tuple[str, int], int] = {}
        for partition, offset in pending:
            first[partition] = min(offset, first.get(partition, offset))
        self._reader.commit(first or None)

    def close(self) -> None:
        for reader in (self._reader, self._dead):
            if reader is not None:
                reader.close()


class EpisodeStream:
    """Admits, deduplicates and groups episodes; yields batches (lists of whole groups)."""

    def __init__(self, source: EpisodeSource, config: StreamConfig, seen: set[str] | None = None):
        self.source, self.config = source, config
        self.seen: set[str] = set(seen or ())
        self.stats = StreamStats()
        self._groups: dict[str, list[Episode]] = defaultdict(list)
        self._opened: dict[str, float] = {}  # group -> time.monotonic() of its first episode
        self._lost: Counter[str] = Counter()  # group -> members that will never be trained on
        self._ready: list[list[Episode]] = []
        self._positions: dict[str, Position] = {}  # admitted, not yet trained on

    def _admit(self, episode: Episode, current_version: int) -> Admission:
        self.stats.read += 1
        if episode.episode_id in self.seen:
            self.stats.duplicates += 1
            return Admission.SKIPPED
        self.seen.add(episode.episode_id)
        if self.config.task_ids is not None and episode.task_id not in self.config.task_ids:
            self.stats.not_trained_task += 1
            return Admission.SKIPPED
        if episode.dead_letter is not None:
            self.stats.dead_letters += 1
            self.stats.by_reason[episode.dead_letter] += 1
            if superseded(episode):  # not a member: the attempt that replaced it is
                self.stats.superseded += 1
                return Admission.SKIPPED
            return Admission.LOST
        if not any(any(s.loss_mask) for s in episode.samples):
            self.stats.empty += 1
            return Admission.LOST
        if policy_lag(episode, current_version) > self.config.max_staleness:
            if self.config.stale is StalePolicy.DROP:
                self.stats.stale_dropped += 1
                return Admission.LOST
            self.stats.stale_kept += 1
        return Admission.ADMITTED

    def next_batch(self, current_version: int, timeout: float = 1.0) -> list[Episode] | None:
        """Whole groups up to the token budget, or None if none is complete yet."""
        for episode, position in self.source.poll(timeout):
            admission = self._admit(episode, current_version)
            if admission is Admission.SKIPPED:
                continue
            key = group_key(episode)
            self._opened.setdefault(key, time.monotonic())
            if admission is Admission.LOST:
                self.stats.lost_members += 1
                self._lost[key] += 1
            else:
                if position is not None:
                    self._positions[episode.episode_id] = position
                self._groups[key].append(episode)
            if len(self._groups.get(key, ())) + self._lost[key] >= self.config.group_size:
                self._release(key, timed_out=False)
        self._release_timed_out()
        wanted = self.config.groups_per_batch
        if not self._ready or (wanted is not None and len(self._ready) < wanted):
            return None
        self._drop_stale(current_version)
        if not self._ready or (wanted is not None and len(self._ready) < wanted):
            return None
        batch: list[Episode] = []
        tokens, groups = 0, 0
        while self._ready and (wanted is None or groups < wanted):
            size = sum(len(s.token_ids) for e in self._ready[0] for s in e.samples)
            if batch and tokens + size > self.config.token_budget:
                break
            batch += self._ready.pop(0)
            tokens += size
            groups += 1
        return batch

    def _drop_stale(self, current_version: int) -> None:
        """Ready groups that have grown too stale while they waited (admitted at an older
        version: a backlog trains over many updates) are dropped, as at admission."""
        if self.config.stale is not StalePolicy.DROP:
            return
        keep = []
        for group in self._ready:
            if any(policy_lag(e, current_version) > self.config.max_staleness for e in group):
                self.stats.stale_dropped += len(group)
                self.trained(group)  # read and done with: its stream position may move past it
            else:
                keep.append(group)
        self._ready = keep

    def _release_timed_out(self) -> None:
        limit = self.config.group_timeout_s
        if limit is None:
            return
        now = time.monotonic()
        for key in [k for k, t in self._opened.items() if now - t >= limit]:
            self._release(key, timed_out=True)

    def _release(self, key: str, timed_out: bool) -> None:
        """Group ``key`` is as complete as it will be: whole, short (two or more came: trained
        as a smaller group) or alone (not trained on; it stops holding back the position)."""
        group = self._groups.pop(key, [])
        self._opened.pop(key, None)
        self._lost.pop(key, None)
        size = self.config.group_size
        if len(group) >= size:
            self._ready.append(group[:size])
        elif len(group) >= 2:
            self.stats.partial_groups += 1
            self._ready.append(group)
        else:
            if timed_out:
                self.stats.timed_out_alone += len(group)
            else:
                self.stats.short_alone += len(group)
            self.trained(group)  # released: no longer holds back the committed position
            if self.config.groups_per_batch is not None:
                # One round's batch counts its groups: one without signal still ends its
                # round, as an empty group (an update with nothing to train on, skipped).
                self.stats.empty_groups += 1
                self._ready.append([])

    def pending(self) -> int:
        return sum(len(g) for g in self._groups.values()) + sum(len(g) for g in self._ready)

    def position(self, episode_id: str) -> Position | None:
        """Where an admitted episode not yet trained on was read (None: from an archive)."""
        return self._positions.get(episode_id)

    def trained(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._positions.pop(episode.episode_id, None)

    def done_ids(self) -> set[str]:
        """Ids of episodes trained on or refused: everything seen but the pending ones."""
        pending = {e.episode_id for g in self._groups.values() for e in g}
        pending |= {e.episode_id for g in self._ready for e in g}
        return self.seen - pending

    def commit(self) -> None:
        """Commit the source position without losing admitted-but-untrained episodes."""
        self.source.commit(list(self._positions.values()))
