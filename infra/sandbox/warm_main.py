"""A warm sandbox's stand-by process: started ahead of a rollout, it waits for its claim.

    python -I warm_main.py CONTROL_DIR [MODULE...]

It runs inside a pool member's sandbox (:mod:`infra.sandbox.warm_pool`), where nothing of this
repository is visible, so it imports only the standard library (and the ``MODULE`` s it is told
to preload). Steps:

1. import each ``MODULE`` (the harness's heavy imports, e.g. ``openai``), then write
   ``CONTROL_DIR/ready`` with the sandbox's tag (the pool serves no member before it exists);
2. read one JSON line from the FIFO ``CONTROL_DIR/claim``: ``{"argv": [...], "env": {...},
   "cwd": "/app"}`` (EOF, the pool gone before a claim: exit 0 at once);
3. remove ``CONTROL_DIR``, so the rollout sees none of it; set the environment to the claim's
   over the sandbox's own ``HOME``, ``TMPDIR``, ``PATH`` and process tag, exactly what a cold
   sandbox of the same spec starts with; change to ``cwd``;
4. run the command: in this process when it is ``PYTHON -I SCRIPT ARGS...`` for this very
   interpreter (the preloaded modules are then already imported), else ``execvpe`` it.

Exit codes are the command's. A failure before the claim is written to stderr with exit 3
(the pool quarantines the member; it never serves a rollout).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import shutil
import sys
from typing import Any

KEPT = ("HOME", "TMPDIR", "PATH", "OPENFORGE_SERVICE_ID")  # what the sandbox itself sets


def _read_claim(control: str) -> dict[str, Any] | None:
    with open(os.path.join(control, "claim"), "rb") as fifo:
        line = fifo.readline()
    if not line.strip():
        return None
    claim = json.loads(line)
    if not isinstance(claim, dict) or not isinstance(claim.get("argv"), list):
        raise ValueError(f"a claim is an object with an argv list, not {line[:200]!r}")
    return claim


def _same_python(argv: list[str]) -> str | None:
    """The script when ``argv`` is ``[this python, -I, script, ...]``, else None."""
    if len(argv) < 3 or argv[1] != "-I" or argv[2].startswith("-"):
        return None
    if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    return argv[2]


def _environment(claim: dict[str, Any]) -> dict[str, str]:
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    env.update({str(k): str(v) for k, v in dict(claim.get("env") or {}).items()})
    return env


def main() -> int:
    control, modules = sys.argv[1], sys.argv[2:]
    try:
        for module in modules:
            importlib.import_module(module)
        # The sandbox's tag, for the pool; renamed into place, so it is never seen half written.
        with open(os.path.join(control, "ready.part"), "w") as f:
            f.write(os.environ.get("OPENFORGE_SERVICE_ID", ""))
        os.rename(os.path.join(control, "ready.part"), os.path.join(control, "ready"))
        claim = _read_claim(control)
    except Exception as exc:  # any failure before the claim: not healthy
        print(f"openforge-warm: not ready: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    if claim is None:
        return 0
    shutil.rmtree(control, ignore_errors=True)
    argv = [str(a) for a in claim["argv"]]
    env = _environment(claim)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(str(claim.get("cwd") or "/"))
    script = _same_python(argv)
    if script is None:
        os.execvpe(argv[0], argv, env)
    sys.argv = [script, *argv[3:]]  # sys.path as -I leaves it: without the script's directory
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
