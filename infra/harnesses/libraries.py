"""The system shared libraries a harness's install loads, for an image that may lack them.

A sandbox on this machine sees this machine's ``/usr/lib``; an image carries its own, and a slim
one lacks much: ``debian:bookworm-slim`` has no ``libssl.so.3``, which Python's ``ssl`` loads
(and the OpenAI SDK imports ``ssl``). :func:`shared_libraries` asks ``ldd`` what the ELF files
of an install load, leaving out the C library's own objects (every glibc image has them, and
one of another build must not replace them); :func:`infra.images.layers.add_files` adds only
those an image has none of.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from schemas.errors import SetupError

GLIBC = frozenset({
    "linux-vdso.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libc.so.6", "libm.so.6",
    "libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1", "libresolv.so.2",
})  # fmt: skip
SKIP = ("_tkinter",)  # no GUI: Tk and X11 are not an agent's
_NEEDED = re.compile(r"^\s*(\S+) => (/\S+) \(0x[0-9a-f]+\)$")


def _files(paths: list[Path]) -> list[Path]:
    """The regular files among ``paths`` and under the (real) directories among them."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            out.extend(Path(d) / f for d, _, files in os.walk(path) for f in files)
        else:
            out.append(path)
    return [f for f in out if f.is_file() and not f.is_symlink()]


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def shared_libraries(paths: list[Path]) -> list[Path]:
    """The shared libraries that the ELF files among ``paths`` (directories walked) load and
    that are not among them, except the C library's own: each as the name the loader looks for
    (a symlink, often), in its real directory, and the file it resolves to."""
    files = _files(paths)
    have = {f.name for f in files}
    objects = [f for f in files if not f.name.startswith(SKIP) and _is_elf(f)]
    found: set[Path] = set()
    for start in range(0, len(objects), 200):
        try:
            done = subprocess.run(
                ["ldd", *map(str, objects[start : start + 200])],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SetupError(f"cannot run ldd to list the harness's libraries ({exc})") from exc
        for line in done.stdout.splitlines():
            match = _NEEDED.match(line)
            if match and match[1] not in GLIBC and match[1] not in have:
                named = Path(match[2]).parent.resolve() / Path(match[2]).name
                found.update((named, named.resolve()))
    return sorted(found)
