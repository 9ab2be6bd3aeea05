"""``openforge replay rebuild``: a run's episodes rebuilt from its archived events, and checked.

The batch job of ``openforge pipeline replay`` (Beam, on FnApiRunner by default) reads the
completion, rollout and reward events of an archive (``RUN/archive/``, or any archive root) and
assembles every episode again with the assembly code of this checkout, into ``DIR`` (one archive
root: ``DIR/record=episode/``, dead letters with their reason; ``openforge query --archive DIR``
reads it). Then the rebuilt episodes are compared with the archived ones, record for record and
in no particular order: the same episode ids, and for each the same contents (everything but
``created_us``, the moment it was built). When nothing changed they are equal; otherwise the
difference is reported: episodes only in the archive, only in the rebuild, and the fields that
differ. Dead letters the rebuild makes for rollouts the run never settled (its streaming job
stopped before their deadline: no reward came) are counted apart; they are not a difference.

Of several archived records of one episode (an at-least-once log, a restarted job), the one that
counts is the one the ``episodes`` view shows: an episode over a dead letter, then the latest.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.archive import EVENT_RECORDS
from pipeline.jobs import Outputs, RunReport, run_replay
from schemas.archive import archive_files, read_archive
from schemas.episode import Episode
from schemas.errors import ConfigError

DEFAULT_LATENESS_S = 600.0  # the pipeline's default
_IGNORED = {"created_us"}  # when an episode was built: differs on every build


def archive_root(path: Path) -> Path:
    """``path`` if it is an archive root (it holds ``record=NAME/``), or a run directory's
    ``archive/``; else a ConfigError that says what to pass."""
    path = Path(path)
    for candidate in (path, path / "archive"):
        if candidate.is_dir() and any(p.is_dir() for p in candidate.glob("record=*")):
            return candidate
    if not path.exists():
        raise ConfigError(f"--from {path}: no such directory; pass a run's archive/ directory")
    raise ConfigError(
        f"--from {path} is not an archive: it has no record=NAME/ directories (nor an archive/ "
        "that has). Pass RUN/archive of an `openforge train` run, or an archive root."
    )


def run_lateness(root: Path) -> float:
    """The lateness the run's streaming job used (``[pipeline] lateness_s`` of the run's
    ``config.toml`` beside the archive), or the pipeline's default."""
    config = root.parent / "config.toml"
    try:
        value = tomllib.loads(config.read_text()).get("pipeline", {}).get("lateness_s")
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT_LATENESS_S
    return float(value) if isinstance(value, int | float) else DEFAULT_LATENESS_S


def latest_episodes(episodes: Iterable[Episode]) -> dict[str, Episode]:
    """One record per episode id: an episode over a dead letter, then the latest built."""
    out: dict[str, Episode] = {}
    for episode in episodes:
        held = out.get(episode.episode_id)
        rank = (episode.dead_letter is None, episode.created_us)
        if held is None or rank > (held.dead_letter is None, held.created_us):
            out[episode.episode_id] = episode
    return out


def differing_fields(a: Episode, b: Episode) -> list[str]:
    """The fields of two records of an episode that differ (its build time aside)."""
    return [
        f.name
        for f in dataclasses.fields(Episode)
        if f.name not in _IGNORED and getattr(a, f.name) != getattr(b, f.name)
    ]


@dataclass
class EpisodeDiff:
    """Archived vs rebuilt episodes (episode ids, sorted)."""

    only_archived: list[str] = field(default_factory=list)
    only_rebuilt: list[str] = field(default_factory=list)
    differing: dict[str, list[str]] = field(default_factory=dict)  # id -> fields that differ
    unsettled: list[str] = field(default_factory=list)  # rebuilt dead letters, never settled

    @property
    def identical(self) -> bool:
        return not (self.only_archived or self.only_rebuilt or self.differing)


def compare(archived: dict[str, Episode], rebuilt: dict[str, Episode]) -> EpisodeDiff:
    diff = EpisodeDiff()
    for episode_id in sorted(archived.keys() | rebuilt.keys()):
        a, b = archived.get(episode_id), rebuilt.get(episode_id)
        if b is None:
            diff.only_archived.append(episode_id)
        elif a is None:
            (diff.unsettled if b.dead_letter is not None else diff.only_rebuilt).append(episode_id)
        elif fields := differing_fields(a, b):
            diff.differing[episode_id] = fields
    return diff


@dataclass
class RebuildReport:
    source: Path
    to: Path
    events: dict[str, int]  # archived records per event type (duplicate deliveries included)
    archived: dict[str, Episode]
    rebuilt: dict[str, Episode]
    diff: EpisodeDiff | None
    pipeline: RunReport

    def lines(self, show: int = 10) -> list[str]:
        def count(episodes: dict[str, Episode]) -> str:
            dead = sum(e.dead_letter is not None for e in episodes.values())
            return f"{len(episodes) - dead} episodes, {dead} dead letters"

        events = ", ".join(f"{self.events.get(n, 0)} {n}" for n in EVENT_RECORDS)
        out = [
            f"events in {self.source}: {events}",
            f"rebuilt into {self.to}: {count(self.rebuilt)}",
            f"archived: {count(self.archived)}",
            self.pipeline.line(),
        ]
        diff = self.diff
        if diff is None:
            return out
        if diff.unsettled:
            out.append(
                f"{len(diff.unsettled)} dead letters only in the rebuild: rollouts the run's "
                "streaming job had not settled when it stopped (not a difference)"
            )
        if diff.identical:
            out.append(
                f"identical: all {len(self.archived)} archived episodes rebuilt as they were"
            )
            return out
        out.append(
            f"DIFFERENT: {len(diff.differing)} differ, {len(diff.only_archived)} only archived, "
            f"{len(diff.only_rebuilt)} only rebuilt"
        )
        for episode_id, fields in list(diff.differing.items())[:show]:
            rollout = self.archived[episode_id].rollout_id
            out.append(f"  differs  {episode_id} (rollout {rollout}): {', '.join(fields)}")
        for label, ids, side in (
            ("archived", diff.only_archived, self.archived),
            ("rebuilt ", diff.only_rebuilt, self.rebuilt),
        ):
            for episode_id in ids[:show]:
                out.append(f"  only {label} {episode_id} (rollout {side[episode_id].rollout_id})")
        return out


def event_counts(root: Path) -> dict[str, int]:
    """Records per event type in the archive, from the Parquet footers (nothing decoded)."""
    return {
        name: sum(pq.ParquetFile(p).metadata.num_rows for p in archive_files(root, name))
        for name in EVENT_RECORDS
    }


def rebuild(
    source: Path,
    to: Path,
    beam_args: Sequence[str] = (),
    lateness_s: float | None = None,
    check: bool = True,
) -> RebuildReport:
    """Rebuild the episodes of the archive at ``source`` (an archive root or a run directory)
    into ``to`` (new or empty) and, with ``check``, compare them with the archived ones."""
    root = archive_root(source)
    to = Path(to)
    if to.exists() and any(to.iterdir()):
        raise ConfigError(f"--to {to} is not empty: rebuild into a new or empty directory")
    counts = event_counts(root)
    if not any(counts.values()):
        raise ConfigError(
            f"{root} holds no completion, rollout or reward events: nothing to rebuild from "
            "(runs before the event archive kept only episodes; `openforge pipeline replay` "
            "needs an archive of events too)"
        )
    lateness = run_lateness(root) if lateness_s is None else lateness_s
    report = run_replay(str(root), Outputs(run_archive=str(to)), beam_args, lateness)
    rebuilt = latest_episodes(read_archive(to, Episode))
    archived = latest_episodes(read_archive(root, Episode)) if check else {}
    diff = compare(archived, rebuilt) if check else None
    return RebuildReport(root, to, counts, archived, rebuilt, diff, report)
