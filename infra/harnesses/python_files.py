"""The files a Python program needs from its interpreter, for an image layer (not a mount).

A sandbox on this machine mounts the agent's whole Python read-only, at no cost. An image that
carries it (a Kubernetes pod runs what its node has) holds copies, and the project's venv is
gigabytes (torch, vLLM) of which the agent loads the OpenAI SDK alone. :func:`python_files`
asks the interpreter for what running a script on some packages takes: the executable and the
symlinks to it, ``libpython``, the standard library (without its tests, the static library, the
GUI and the base installation's own site-packages) and, in a venv, ``pyvenv.cfg`` and the files
of the packages named and of everything they require, as their installed metadata lists them.
The system libraries those files load: :mod:`infra.harnesses.libraries`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from schemas.errors import SetupError

# Run by the interpreter itself (standard library only): the files, one per line, as JSON.
_PROBE = r"""
import json, os, re, sys, sysconfig
import importlib.metadata as md

SKIP = {"site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo",
        "ensurepip", "lib2to3", "pydoc_data"}
out = set()

def walk(root, top=True):
    for dirpath, dirs, files in os.walk(root):
        if dirpath == root:
            dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith("config-")]
        for f in files:
            out.add(os.path.join(dirpath, f))
        for d in dirs:
            p = os.path.join(dirpath, d)
            if os.path.islink(p):
                out.add(p)

def closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if name in names:
                raise SystemExit(f"{name} is not installed in {sys.prefix}")
            continue
        for f in dist.files or []:
            out.add(os.path.abspath(str(dist.locate_file(f))))
        for req in dist.requires or []:
            spec, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            todo.append(re.split(r"[\s<>=!~\[(;]", spec.strip(), maxsplit=1)[0])

v = sysconfig.get_config_vars()
walk(sysconfig.get_path("stdlib"))
if v.get("Py_ENABLE_SHARED") and v.get("LIBDIR") and v.get("INSTSONAME"):
    out.add(os.path.join(v["LIBDIR"], v["INSTSONAME"]))
out.add(sys.executable)
if sys.prefix != sys.base_prefix:
    out.add(os.path.join(sys.prefix, "pyvenv.cfg"))
closure(sys.argv[1:])
print(json.dumps(sorted(p for p in out if os.path.lexists(p))))
"""


def python_files(python: Path, packages: list[str]) -> list[Path]:
    """The files (absolute, symlinks not followed) that ``python -I SCRIPT`` importing
    ``packages`` needs; the symlinks from ``python`` to the real executable are the caller's
    (:func:`infra.harnesses.agent.interpreter` lists them)."""
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE, *packages],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"cannot run {python} to list its files ({exc})") from exc
    if done.returncode != 0:
        raise SetupError(
            f"{python} could not list the files of {', '.join(packages)}: "
            f"{done.stderr.strip()[-500:]}. Install them there (`scripts/setup project`)."
        )
    return [Path(p) for p in json.loads(done.stdout)]
