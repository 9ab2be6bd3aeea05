"""What weight swaps told a proxy, remembered across its restarts: the policy version and an
unfinished pause.

``POST /admin/policy`` sets the version; the proxy writes it to ``<spool_dir>/policy-version``
(atomically, synced) before it answers, and a proxy started without ``--policy-version`` begins
at the one remembered there (else 0). ``POST /admin/pause`` writes when the pause ends by
itself to ``<spool_dir>/pause-until`` before it answers, ``/admin/resume`` removes it, and a
proxy started before that time starts paused for what is left of it.

So a proxy restarted in the middle of a weight swap neither stamps the version before the swap
on tokens of the new weights (it holds new calls until the trainer, retrying, has set the new
version and resumed it), nor, restarted later, stamps 0 on the tokens of the version vLLM
serves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from schemas.errors import ConfigError

VERSION_FILE = "policy-version"
PAUSE_FILE = "pause-until"


def remembered(spool_dir: Path) -> int | None:
    """The version last stored in ``spool_dir``, if any."""
    text = _read(spool_dir / VERSION_FILE)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{spool_dir / VERSION_FILE} holds {text[:40]!r}, not a policy version: delete it, "
            "or start the proxy with --policy-version N"
        ) from None


def remember(spool_dir: Path, version: int) -> None:
    """Store ``version`` durably."""
    _write(spool_dir / VERSION_FILE, f"{version}\n")


def pause_left(spool_dir: Path) -> float | None:
    """Seconds left of a pause stored before a restart (None: none, or it has ended)."""
    text = _read(spool_dir / PAUSE_FILE)
    try:
        left = float(text) - time.time() if text is not None else 0.0
    except ValueError:
        left = 0.0  # a damaged marker: resume rather than hold calls on a guess
    return left if left > 0 else None


def remember_pause(spool_dir: Path, seconds: float) -> None:
    """Store that a pause lasts ``seconds`` from now at most."""
    _write(spool_dir / PAUSE_FILE, f"{time.time() + seconds:.3f}\n")


def forget_pause(spool_dir: Path) -> None:
    (spool_dir / PAUSE_FILE).unlink(missing_ok=True)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _write(path: Path, text: str) -> None:
    """Write, fsync, rename: the file holds the old text or the new, never part of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
