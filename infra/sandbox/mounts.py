"""The two mount calls the container sandbox makes per run, as system calls (``mount(2)`` and
``umount2(2)`` through libc) rather than a ``mount``/``umount`` process each: a run's layer is
mounted and unmounted in microseconds instead of a fork and exec of util-linux's tools (about
7 ms each on 2 busy cores)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache
from pathlib import Path

from schemas.errors import SandboxError

MNT_DETACH = 2
EINVAL = 22  # an option this kernel does not know


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    """An overlay of ``upper`` (writable) over ``lower`` (read-only) at ``target``; ``volatile``
    (no sync of the upper layer, which is thrown away after the run; Linux >= 5.10) where the
    kernel takes it."""
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    for extra in (",volatile", ""):
        data = (options + extra).encode()
        if _libc().mount(b"overlay", os.fsencode(target), b"overlay", 0, data) == 0:
            return
        errno = ctypes.get_errno()
        if errno != EINVAL:
            break
    raise SandboxError(
        f"cannot mount the run's layer over the image at {target}: {os.strerror(errno)}"
    )


def unmount(target: Path) -> None:
    """Unmount ``target``; lazily (detached) when it is still busy."""
    path = os.fsencode(target)
    if _libc().umount2(path, 0) != 0 and _libc().umount2(path, MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"cannot unmount {target}: {os.strerror(errno)}; unmount it by hand")
