"""Rollouts the proxy knows: attribution by path, per-rollout API key, or session identity.

A key minted for one rollout only ever records into that rollout.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field

from proxy.continuity import ContinuityTracker

KEY_PREFIX = "ofk_"


@dataclass
class Rollout:
    rollout_id: str
    created_us: int
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    harness_version: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    api_key: str | None = None
    next_call: int = 0
    finished: bool = False
    tracker: ContinuityTracker = field(init=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.tracker = ContinuityTracker(self.rollout_id)

    def take_call_index(self) -> int:
        index = self.next_call
        self.next_call += 1
        return index


class RolloutRegistry:
    def __init__(self) -> None:
        self._by_id: dict[str, Rollout] = {}
        self._by_key: dict[str, Rollout] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, rollout_id: str) -> Rollout | None:
        return self._by_id.get(rollout_id)

    def by_key(self, key: str) -> Rollout | None:
        return self._by_key.get(key)

    def create(self, rollout_id: str, *, mint_key: bool, **fields: object) -> Rollout:
        rollout = Rollout(rollout_id=rollout_id, created_us=time.time_ns() // 1000, **fields)  # type: ignore[arg-type]
        if mint_key:
            rollout.api_key = KEY_PREFIX + secrets.token_urlsafe(24)
            self._by_key[rollout.api_key] = rollout
        self._by_id[rollout_id] = rollout
        return rollout
