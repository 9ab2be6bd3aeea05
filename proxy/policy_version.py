"""The policy version a proxy stamps, remembered across its restarts.

``POST /admin/policy`` sets it; the proxy writes it to ``<spool_dir>/policy-version`` (atomically,
synced) before it answers, and a proxy started without ``--policy-version`` begins at the one
remembered there (else 0). A proxy restarted in front of a vLLM that serves version N therefore
stamps N, not 0, on the tokens of its first calls, before the trainer's next swap.
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.errors import ConfigError

FILE = "policy-version"


def remembered(spool_dir: Path) -> int | None:
    """The version last stored in ``spool_dir``, if any."""
    path = spool_dir / FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{path} holds {text[:40]!r}, not a policy version: delete it, or start the proxy "
            "with --policy-version N"
        ) from None


def remember(spool_dir: Path, version: int) -> None:
    """Store ``version`` durably (write, fsync, rename)."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    tmp = spool_dir / f".{FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{version}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, spool_dir / FILE)
