"""What is due after each update: a weight sync, a checkpoint, and the policy version served next.

    schedule = Schedule(sync_every=1, checkpoint_every=1)
    due = schedule.after(step, version)  # step: the update just made, counted from 1

Every rank asks the same schedule with the same step and version, so the lead and the other
ranks sync, checkpoint and count policy versions alike. An update whose weights are synced is
served as the next policy version (one above the one served before it); one that is not synced
leaves the served version as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import ConfigError


@dataclass(frozen=True)
class Due:
    """What to do after one update.

    Attributes:
        sync: export the weights and hand them to the inference server.
        checkpoint: write a checkpoint (and then commit the stream position).
        version: the policy version served after this update.
    """

    sync: bool
    checkpoint: bool
    version: int


@dataclass(frozen=True)
class Schedule:
    """Attributes:
    sync_every: updates between weight syncs (None: the weights are never handed over).
    checkpoint_every: updates between checkpoints.
    """

    sync_every: int | None = 1
    checkpoint_every: int = 1

    def __post_init__(self) -> None:
        if self.sync_every is not None and self.sync_every < 1:
            raise ConfigError(f"sync_every must be at least 1 (or None), not {self.sync_every}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every must be at least 1, not {self.checkpoint_every}")

    def after(self, step: int, version: int) -> Due:
        """What is due after update ``step`` (from 1), with ``version`` served before it."""
        sync = self.sync_every is not None and step % self.sync_every == 0
        return Due(
            sync=sync,
            checkpoint=step % self.checkpoint_every == 0,
            version=version + 1 if sync else version,
        )
