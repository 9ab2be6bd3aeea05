"""Which partitions of the events topic one streaming job reads, when several share the work.

The proxy keys every record by its rollout id, so all of a rollout's events (its start, its
calls, its end, its rewards) are in one partition. ``N`` jobs started with ``--worker I/N``
(``I`` = 0..N-1) read the partitions ``p`` with ``p % N == I``: each assembles whole rollouts,
no two assemble the same one, and together they read every partition. The topic needs at least
``N`` partitions (``kafka://HOST:PORT?partitions=N`` when it is created).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from schemas.errors import ConfigError

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ConfigError(
                f"worker {self.index}/{self.count}: the index must be 0 to {self.count - 1} "
                "(--worker I/N, e.g. --worker 0/2 and --worker 1/2 for two jobs)"
            )

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N``, e.g. ``1/2``."""
        match = _SHARD.match(text)
        if match is None:
            raise ConfigError(f"--worker takes I/N (e.g. 0/2), not {text!r}")
        return cls(int(match[1]), int(match[2]))

    def mine(self, partitions: list[int], topic: str) -> list[int]:
        """This job's share of ``partitions``; an error if it has none."""
        owned = [p for p in partitions if p % self.count == self.index]
        if not owned:
            raise ConfigError(
                f"worker {self.index}/{self.count} has no partition of {topic!r}, which has "
                f"{len(partitions)}: create it with at least {self.count} "
                f"(kafka://HOST:PORT?partitions={self.count}) or run fewer workers"
            )
        return owned

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
