"""Python environments for tasks whose Dockerfile runs ``pip install ...``, built once per exact
requirement list and cached under ``$OPENFORGE_CACHE/task-envs/``.

The environment is a venv on this machine's own ``/usr/bin/python3`` (the interpreter a
sandbox sees, since the host's system directories are its root filesystem), filled by pip from
PyPI. A sandbox mounts it read-only at the same path and puts its ``bin`` first on ``PATH``, so
``pytest`` and ``python3`` there are the task's. Concurrent rollouts of the same task wait for
one build (a file lock); a failed build leaves nothing that looks complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infra import paths
from schemas.errors import SetupError

SYSTEM_PYTHON = Path("/usr/bin/python3")


@dataclass(frozen=True)
class PipEnv:
    root: Path
    requirements: tuple[str, ...]
    built: bool  # True when this call installed it (False: it was cached)
    seconds: float

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"


def env_key(requirements: Sequence[str], python: Path = SYSTEM_PYTHON) -> str:
    """The cache key: the exact requirement list (order kept) and the interpreter."""
    blob = json.dumps([str(python), list(requirements)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_pip_env(
    requirements: Sequence[str], python: Path = SYSTEM_PYTHON, timeout_s: float = 900
) -> PipEnv:
    """The cached environment with ``requirements`` installed, building it if needed."""
    if not python.exists():
        raise SetupError(
            f"{python} is not there: tasks that `pip install` need this machine's system "
            "Python (apt-get install python3)"
        )
    start = time.monotonic()
    root = paths.cache_dir() / "task-envs" / env_key(requirements, python)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".complete").exists():
            return PipEnv(root, tuple(requirements), False, time.monotonic() - start)
        shutil.rmtree(root, ignore_errors=True)
        steps = [
            [str(python), "-m", "venv", "--without-pip", str(root)],
            # This environment's pip installs into the task's venv (pip's --python).
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(root / "bin" / "python"),
                "install",
                "--no-input",
                "--disable-pip-version-check",
                "-q",
                *requirements,
            ],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                shutil.rmtree(root, ignore_errors=True)
                raise SetupError(
                    f"cannot build the task environment for {list(requirements)}: "
                    f"`{' '.join(argv[:6])} ...` failed:\n{(done.stderr or done.stdout)[-2000:]}"
                )
        (root / "requirements.json").write_text(json.dumps(list(requirements)) + "\n")
        (root / ".complete").touch()
    return PipEnv(root, tuple(requirements), True, time.monotonic() - start)
