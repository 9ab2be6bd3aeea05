"""Packages a bench compares against that are not the project's dependencies (they lost, or
are still on trial): installed on first use into ``$OPENFORGE_CACHE/bench/NAME-VERSION`` with
``pip install --target`` (no dependencies), and put on ``sys.path`` or a child's PYTHONPATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra.paths import cache_dir


def package_dir(name: str, version: str) -> Path:
    """A directory with ``name==version`` installed (on first use)."""
    target = cache_dir() / "bench" / f"{name}-{version}"
    if not (target / ".complete").exists():
        print(f"installing {name}=={version} into {target}", flush=True)
        shutil.rmtree(target, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        subprocess.run([*pip, f"{name}=={version}"], check=True)
        (target / ".complete").touch()
    return target


def importable(name: str, version: str) -> None:
    """Make ``name==version`` importable in this process."""
    path = str(package_dir(name, version))
    if path not in sys.path:
        sys.path.insert(0, path)
