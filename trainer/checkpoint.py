"""Trainer checkpoints: weights or adapter, optimizer, step, policy version, consumed episodes.

A checkpoint is written to a temporary directory and renamed into place, then ``LATEST`` names it;
only then does the trainer commit its position in the episode stream. After a crash between the
two, the episodes delivered again are recognised by id and skipped: no episode is trained on twice,
and none is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from trainer.backends.base import TrainerBackend
from trainer.ranks import Ranks


@dataclass
class TrainerState:
    step: int = 0
    policy_version: int = 0
    seen: set[str] = field(default_factory=set)  # episode ids consumed (trained on or refused)


def save(
    root: Path, backend: TrainerBackend, state: TrainerState, ranks: Ranks | None = None
) -> Path:
    """Write a checkpoint; with several ranks every one calls this (the backend's save is
    collective) and the lead writes the state and moves it into place."""
    ranks = ranks or Ranks()
    final = root / f"step-{state.step:08d}"
    # One temporary directory for all ranks: the lead's pid names it.
    tmp = root / f".tmp-{final.name}-{ranks.broadcast(os.getpid())}"
    if ranks.lead:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    ranks.barrier()
    backend.save(tmp)
    ranks.barrier()
    if ranks.lead:
        (tmp / "state.json").write_text(
            json.dumps(
                {
                    "step": state.step,
                    "policy_version": state.policy_version,
                    "seen": sorted(state.seen),
                }
            )
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        latest = root / "LATEST"
        latest.with_suffix(".tmp").write_text(final.name)
        latest.with_suffix(".tmp").replace(latest)
    ranks.barrier()
    return final


def latest_state(root: Path) -> TrainerState | None:
    """The state of the latest checkpoint under ``root`` without loading its weights."""
    latest = root / "LATEST"
    if not latest.exists():
        return None
    data = json.loads((root / latest.read_text().strip() / "state.json").read_text())
    return TrainerState(int(data["step"]), int(data["policy_version"]), set(data["seen"]))


def load_latest(root: Path, backend: TrainerBackend) -> TrainerState | None:
    latest = root / "LATEST"
    if not latest.exists():
        return None
    directory = root / latest.read_text().strip()
    backend.load(directory)
    data = json.loads((directory / "state.json").read_text())
    return TrainerState(int(data["step"]), int(data["policy_version"]), set(data["seen"]))


class PolicyVersions:
    """The policy versions handed to vLLM, one JSON line each (``versions.jsonl``), written and
    fsynced *before* the swap. A version is never reused: after a crash between a swap and the
    checkpoint, vLLM may serve weights the checkpoint does not have, so a resumed trainer goes
    on from the highest version ever handed out, not the checkpoint's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._high = 0
        if path.exists():  # read once: afterwards this process is the only writer
            self._high = max(
                (
                    int(json.loads(line)["version"])
                    for line in path.read_text().splitlines()
                    if line.strip()
                ),
                default=0,
            )

    def high_water(self) -> int:
        return self._high

    def record(self, step: int, version: int) -> None:
        """Record ``version`` as handed out for update ``step``, durably. A version at or below
        one handed out before is a programming error (ValueError): versions are never reused."""
        if version <= self._high:
            raise ValueError(f"policy version {version} is not above {self._high}, handed out")
        with open(self.path, "a") as f:
            f.write(json.dumps({"version": version, "step": step}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._high = version


def truncate_ledger(path: Path, step: int) -> int:
    """Keep the lines of the consumed-episodes ledger up to ``step`` (the checkpoint resumed
    from): updates after it were lost with the crash and are made again. Returns lines dropped."""
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if int(json.loads(line)["step"]) <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
    return len(lines) - len(kept)
