"""A rollout's final workspace, kept so that a changed verifier can score it again.

The local backend saves the workspace as the agent left it, after the agent's sandbox has ended
and before the verifier runs (so none of the verifier's own writes are in it), into the
rollout's directory::

    ROLLOUT/final-workspace.tar.gz     the workspace (paths relative to its root; symlinks kept)
    ROLLOUT/final-workspace.json       {"saved": true, "bytes": ..., "files": ..., "workdir": ...}
                                       or {"saved": false, "reason": "..."} when it was too large

A workspace larger than ``limit_bytes`` (the sum of its files' sizes) is not saved: the JSON
note says so and names the setting to raise (``openforge rollouts run --max-workspace-mb``).
:func:`restore` extracts a saved workspace with tarfile's ``tar`` filter (nothing lands outside
the target directory). What is not in the archive: directories a task's Dockerfile copies to
outside the workspace (they are laid out afresh from the task), and the harness's home.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import ConfigError

ARCHIVE = "final-workspace.tar.gz"
NOTE = "final-workspace.json"
DEFAULT_LIMIT_BYTES = 64 << 20  # 64 MiB of files per rollout


@dataclass(frozen=True)
class SavedWorkspace:
    """What :func:`save` did: the archive's path (None: not saved) and why not."""

    archive: Path | None
    bytes: int
    files: int
    reason: str | None = None


def _measure(workspace: Path, limit: int) -> tuple[int, int]:
    """(bytes, files) of the workspace; stops counting once past ``limit``."""
    total = count = 0
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            count += 1
            if total > limit:
                return total, count
    return total, count


def too_large(limit_bytes: int, size: int, files: int) -> str:
    """Why a workspace of ``size`` bytes in ``files`` files was not saved."""
    return (
        f"the workspace holds more than {limit_bytes} bytes of files (at least {size} in "
        f"{files} files): not saved, so it cannot be re-scored; raise the limit with "
        "`openforge rollouts run --max-workspace-mb`"
    )


def write_note(rollout_dir: Path, workdir: str, limit_bytes: int, **fields: object) -> None:
    """The rollout's ``final-workspace.json``: where the workspace was, the limit, and
    ``fields`` (``saved``, and the sizes or the reason)."""
    note = {"workdir": workdir, "limit_bytes": limit_bytes, **fields}
    (rollout_dir / NOTE).write_text(json.dumps(note, indent=2) + "\n")


def save(workspace: Path, rollout_dir: Path, workdir: str, limit_bytes: int) -> SavedWorkspace:
    """Archive ``workspace`` (seen at ``workdir`` in the sandbox) into ``rollout_dir``, unless
    its files add up to more than ``limit_bytes``; the note says which, either way."""
    size, files = _measure(workspace, limit_bytes)
    if size > limit_bytes:
        reason = too_large(limit_bytes, size, files)
        write_note(rollout_dir, workdir, limit_bytes, saved=False, reason=reason)
        return SavedWorkspace(None, size, files, reason)
    archive = rollout_dir / ARCHIVE
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for item in sorted(workspace.iterdir()):
            tar.add(item, arcname=item.name)  # symlinks are stored as symlinks
    tmp.rename(archive)
    write_note(rollout_dir, workdir, limit_bytes, saved=True, bytes=size, files=files,
               archive_bytes=archive.stat().st_size)  # fmt: skip
    return SavedWorkspace(archive, size, files)


def save_or_note(
    workspace: Path, rollout_dir: Path, workdir: str, limit_bytes: int
) -> SavedWorkspace:
    """:func:`save`, where a file the archive cannot read (the agent made it unreadable) only
    costs the archive, never the rollout: the note says what failed."""
    try:
        return save(workspace, rollout_dir, workdir, limit_bytes)
    except OSError as exc:
        reason = f"the workspace could not be archived: {exc}"
        (rollout_dir / (ARCHIVE + ".tmp")).unlink(missing_ok=True)
        write_note(rollout_dir, workdir, limit_bytes, saved=False, reason=reason)
        return SavedWorkspace(None, 0, 0, reason)


def saved_note(rollout_dir: Path) -> dict[str, object] | None:
    """The rollout's note (None: its workspace was never saved, e.g. an older run)."""
    path = rollout_dir / NOTE
    if not path.exists():
        return None
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else None


def restore(rollout_dir: Path, target: Path) -> None:
    """Extract the rollout's saved workspace into the (empty) directory ``target``; a
    ConfigError says why not when there is none."""
    archive = rollout_dir / ARCHIVE
    if not archive.exists():
        note = saved_note(rollout_dir) or {}
        why = note.get("reason") or (
            "the run predates saved workspaces (or its backend does not save them)"
        )
        raise ConfigError(f"{rollout_dir}: no saved final workspace: {why}")
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(target, filter="tar")
