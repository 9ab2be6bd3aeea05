"""`scripts/setup project` in a second checkout, as a user with two clones runs it: the clone gets
its own ``.venv`` (hard links into the shared environment under the cache) whose scripts and
editable install are its own, and neither the shared environment nor this checkout's ``.venv``
changes (before, the last checkout set up re-pointed every other's ``openforge``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from infra.paths import shared_env
from tests.readme.session import copy_repository

ROOT = Path(__file__).resolve().parents[1]
FINDER = "lib/python3.11/site-packages/__editable___openforge_0_1_0_finder.py"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _imported_from(venv: Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import openforge; print(openforge.__file__)"],
        cwd=cwd,  # not the checkout: Python puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_a_second_checkout_gets_its_own_environment_and_changes_no_other(tmp_path: Path) -> None:
    shared = shared_env(ROOT / ".venv")  # what this checkout's environment is made of
    assert shared != ROOT / ".venv"
    before = {p: _digest(p) for p in (shared / FINDER, shared / "bin" / "openforge")}
    clone = copy_repository(ROOT, tmp_path / "clone")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    for _ in range(2):  # the second run finds it done
        done = subprocess.run(
            ["scripts/setup", "project"], cwd=clone, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{clone / '.venv'} (hard links into {shared})" in done.stdout

    venv = clone / ".venv"
    assert venv.is_dir() and not venv.is_symlink()
    assert _imported_from(venv, tmp_path) == str(clone / "openforge" / "__init__.py")
    script = (venv / "bin" / "openforge").read_text().splitlines()[0]
    assert script == f"#!{venv}/bin/python3" or script == f"#!{venv}/bin/python", script
    help_ = subprocess.run([str(venv / "bin" / "openforge"), "--help"], capture_output=True)
    assert help_.returncode == 0 and b"Usage" in help_.stdout
    # A hard link of the shared environment's files, not a copy of them.
    torch_init = "lib/python3.11/site-packages/torch/__init__.py"
    assert (venv / torch_init).stat().st_ino == (shared / torch_init).stat().st_ino
    # Nothing else changed: the shared files, and this checkout's own environment.
    assert {p: _digest(p) for p in before} == before
    assert _imported_from(ROOT / ".venv", tmp_path) == str(ROOT / "openforge" / "__init__.py")
