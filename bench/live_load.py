"""Sustained live load on the event log: producers at a fixed rate, and what came out.

The producer (a process of its own, as the proxy and the orchestrator are) writes completion,
lifecycle and reward events at ``rate`` records per second for ``duration_s``, round-robin over
``in_flight`` rollouts at once; each rollout's records in their order, its ``finished``
lifecycle event then its reward last (the order the orchestrator writes them: the agent ends,
then the verifier scores the workspace). Frames are the real encoded records of synthetic
rollouts (``openforge.testing.rollouts``): a pool of templates is encoded once and each new
rollout takes a template's frames with the rollout id replaced by its own, byte for byte (ids
of one length; Arrow IPC has no checksum, the log adds its own crc on append). Encoding a frame
costs ~0.8 ms, so encoding every frame at 4,000 records/s would need three cores by itself.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from infra.eventlog import EPISODES_TOPIC, EVENTS_TOPIC, open_reader, open_writer
from openforge.testing.rollouts import make_rollout
from schemas.codec import decode_message, encode_message
from schemas.completion import CompletionEvent
from schemas.reward import RewardEvent

TEMPLATE_ID = "Q0000000"  # 8 characters; new ids are "L" + 7 digits


def _template_frames(n: int, calls: int) -> list[tuple[list[bytes], int]]:
    """``n`` rollouts' frames (reward moved last) and the count of completion events in each."""
    out = []
    for seed in range(n):
        records = make_rollout(1000 + seed, TEMPLATE_ID, calls=calls).records
        reward = [r for r in records if isinstance(r, RewardEvent)]
        ordered = [r for r in records if not isinstance(r, RewardEvent)] + reward
        frames = [encode_message([r]) for r in ordered]
        out.append((frames, sum(isinstance(r, CompletionEvent) for r in ordered)))
    return out


def rollout_id(n: int) -> str:
    rid = f"L{n:07d}"
    assert len(rid) == len(TEMPLATE_ID)
    return rid


@dataclass
class Produced:
    """What one producer run wrote: target and achieved rate, and each reward's write time."""

    rate: float
    duration_s: float
    records: int = 0
    completions: int = 0
    started: float = 0.0
    stopped: float = 0.0
    reward_at: dict[str, float] = field(default_factory=dict)  # rollout id -> time.time()

    @property
    def achieved(self) -> float:
        return self.records / max(self.stopped - self.started, 1e-9)


def produce_in_process(
    url: str,
    rate: float,
    duration_s: float,
    in_flight: int,
    calls: int,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """:func:`produce` in a process of its own: sets ``ready`` once prepared, starts on ``go``,
    puts the :class:`Produced` on ``results``."""
    results.put(produce(url, rate, duration_s, in_flight, calls, ready, go))


def produce(
    url: str,
    rate: float,
    duration_s: float,
    in_flight: int,
    calls: int,
    ready: Any = None,
    go: Any = None,
) -> Produced:
    """Write at ``rate`` records/s for ``duration_s`` s; then the rollouts in flight finish at
    the same rate and none start, so every rollout written is finished and rewarded."""
    templates = _template_frames(64, calls)
    old = TEMPLATE_ID.encode()
    check = decode_message(templates[0][0][0].replace(old, rollout_id(0).encode()))
    assert getattr(check[0], "rollout_id", None) == rollout_id(0), check
    out = Produced(rate, duration_s)
    next_id = 0
    # per slot: (rollout id, frames left, completions), or None once drained after the end
    slots: list[tuple[str, list[bytes], int] | None] = []

    def start() -> tuple[str, list[bytes], int]:
        nonlocal next_id
        frames, completions = templates[next_id % len(templates)]
        rid = rollout_id(next_id)
        next_id += 1
        new = rid.encode()
        return rid, [f.replace(old, new) for f in frames], completions

    with open_writer(url) as writer:
        slots = [start() for _ in range(in_flight)]
        if ready is not None:
            ready.set()
            go.wait()
        out.started = time.time()
        end = out.started + duration_s
        i, active = 0, in_flight
        while active:
            now = time.time()
            due = int((now - out.started) * rate)
            while out.records < due and active:
                slot = i % in_flight
                i += 1
                current = slots[slot]
                if current is None:
                    continue
                rid, frames, completions = current
                writer.append(EVENTS_TOPIC, rid.encode(), frames.pop(0))
                out.records += 1
                if not frames:  # the reward was this rollout's last record
                    out.reward_at[rid] = time.time()
                    out.completions += completions
                    # past the end, rollouts in flight finish at the same rate; none start
                    slots[slot] = start() if now < end else None
                    active -= slots[slot] is None
            time.sleep(0.001)
        out.stopped = time.time()
    return out


def episode_times(url: str) -> dict[str, float]:
    """Rollout id -> when its episode was appended to the episodes topic (the log's stamp)."""
    out: dict[str, float] = {}
    with open_reader(url, [EPISODES_TOPIC], f"bench-{uuid.uuid4().hex}") as reader:
        while recs := reader.poll(20_000, 0.5):
            for rec in recs:
                out.setdefault((rec.key or b"").decode(), rec.timestamp_ms / 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def backlog(produced: Produced, emitted: dict[str, float], t: float) -> int:
    """Rollouts rewarded by ``t`` whose episode was not out by ``t``."""
    return sum(
        1 for k, at in produced.reward_at.items() if at <= t and emitted.get(k, float("inf")) > t
    )
