"""Files a task set's tasks share, kept in one place and copied into each task when the set is
loaded.

A Harbor task is self-contained: its image's build context, its tests and its solution are in
its own directory. Where several tasks need one file (the web tasks' solutions all drive
Chromium with the browser agent's own driver), a TOML manifest names it once::

    [shared]
    "solution/browser_cdp.py" = "../../infra/harnesses/browser_cdp.py"

Each key is a path inside every task the manifest lists, each value the file's one source,
relative to the manifest's directory. Loading the manifest copies the source to each task where
the copy is missing or differs, so a fix to the source reaches every task at its next load. The
copies are build outputs: the task set ignores them in git, and a tool that reads the task
directories without loading the manifest (Harbor itself) needs one load first
(``openforge tasks check MANIFEST`` does it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from schemas.errors import TaskError


def shared_files(raw: Any, manifest: Path) -> dict[str, Path]:
    """The ``[shared]`` table of ``manifest`` (parsed TOML, or None): path in a task -> source.
    A key that leaves the task directory or a source that is not a file is a TaskError."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TaskError(f'{manifest}: shared must be a table ("path/in/task" = "source")')
    out: dict[str, Path] = {}
    for key, value in raw.items():
        where = f"{manifest}: shared[{key!r}]"
        rel = PurePosixPath(key)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise TaskError(f"{where}: the key must be a path inside each task, like solution/x.py")
        if not isinstance(value, str) or not value:
            raise TaskError(f"{where}: the value must be the source file's path (a string)")
        source = (manifest.parent / value).resolve()
        if not source.is_file():
            raise TaskError(f"{where}: its source {source} is not a file; fix the path")
        out[rel.as_posix()] = source
    return out


def place(shared: Mapping[str, Path], task_dirs: Iterable[Path]) -> int:
    """Copy each shared file into each task where it is missing or differs (keeping the
    source's mode); the number of copies written."""
    written = 0
    for task_dir in task_dirs:
        for rel, source in shared.items():
            target = task_dir / rel
            content = source.read_bytes()
            if target.is_file() and target.read_bytes() == content:
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
                shutil.copymode(source, target)
            except OSError as exc:
                raise TaskError(
                    f"{target}: cannot write the shared file from {source} ({exc}); "
                    "make the task directory writable, or copy it there yourself"
                ) from exc
            written += 1
    return written
