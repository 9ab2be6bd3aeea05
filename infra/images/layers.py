"""An image with files of this machine added at their own absolute paths: a task's image with a
harness's install in it, for a cluster whose pods cannot mount this machine's files.

    ref = with_install(store, task_image_ref, install_of(harness))

The new image is the base plus one layer: each file, symlink or directory (walked) at the same
path, owned by root and readable by all, and every directory above them with its mode on this
machine made traversable (a non-root container user must reach ``/root/.cache/...`` even where
the base's ``/root`` is ``0700``; ``/tmp`` stays ``1777``). It is named by content,
``localhost/openforge/with-<name>:<digest>``: the digest covers the base image's id and each
added path's type, mode, size and modification time, so an unchanged install on an unchanged
base is a lookup. Shared libraries the install loads from the system (``libssl.so.3``, say) are
added only where the base has no file of that name in its library directories: a slim image
gets them, and an image with its own keeps its own.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.harnesses.libraries import shared_libraries
from infra.images.store import ImageStore
from schemas.errors import SetupError

if TYPE_CHECKING:
    from infra.harnesses import Harness

LIBRARY_DIRS = ("usr/lib", "usr/lib64", "usr/local/lib")  # and each library's own directory


def _entries(paths: list[Path]) -> Iterator[Path]:
    """Every path to add: the paths given, and what is under a (real) directory among them."""
    for path in sorted(set(paths)):
        if not path.is_absolute():
            raise SetupError(f"{path}: an image layer takes absolute paths only")
        if not os.path.lexists(path):
            raise SetupError(f"{path} does not exist: is the harness installed?")
        yield path
        if path.is_dir() and not path.is_symlink():
            for dirpath, dirs, files in os.walk(path):
                for name in sorted(dirs + files):
                    yield Path(dirpath) / name


def _parents(entries: list[Path]) -> list[Path]:
    seen = {parent for path in entries for parent in path.parents}
    return sorted(p for p in seen if p != Path("/"))


def layer_digest(base_id: str, entries: list[Path]) -> str:
    h = hashlib.sha256(base_id.encode())
    for path in entries:
        st = os.lstat(path)
        h.update(f"\0{path}\0{stat.S_IFMT(st.st_mode)}:{st.st_mode & 0o7777:o}".encode())
        h.update(f":{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _tar(entries: list[Path], out: Path) -> None:
    """The layer as a tarball: parents first (their modes here, made traversable), then every
    entry (readable by all)."""
    added = set(entries)
    with tarfile.open(out, "w") as tar:
        for parent in _parents(entries):
            if parent in added:
                continue
            info = tarfile.TarInfo(str(parent).lstrip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = stat.S_IMODE(os.stat(parent).st_mode) | 0o555  # /tmp stays 1777
            tar.addfile(info)
        for path in entries:
            info = tar.gettarinfo(str(path), arcname=str(path).lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            executable = info.isdir() or bool(info.mode & 0o111)
            info.mode |= 0o555 if executable else 0o444
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


def _lacking(store: ImageStore, base: str, libraries: list[Path]) -> list[Path]:
    """The shared libraries (by file name) that ``base`` has in none of its library
    directories: only those are added, so the image's own programs keep their own builds."""
    if not libraries:
        return []
    root = store.rootfs(base)
    dirs = {str(lib.parent).lstrip("/") for lib in libraries} | set(LIBRARY_DIRS)
    dirs |= {d.removeprefix("usr/") for d in dirs}
    return [lib for lib in libraries
            if not any(os.path.lexists(root / d / lib.name) for d in dirs)]  # fmt: skip


def add_files(
    store: ImageStore,
    base: str,
    paths: list[Path],
    name: str,
    libraries: Sequence[Path] = (),
) -> str:
    """``base`` with ``paths`` added, and those of ``libraries`` (shared libraries the added
    programs load) that it lacks (see the module docstring); returns the new image's reference,
    built unless the store holds it."""
    entries = list(dict.fromkeys(_entries([*paths, *_lacking(store, base, list(libraries))])))
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "files"
    ref = f"localhost/openforge/with-{slug}:{layer_digest(store.image_id(base), entries)[:20]}"
    if store.exists(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="openforge-layer-") as tmp:
        tarball = Path(tmp) / "layer.tar"
        _tar(entries, tarball)
        ctr = store.run("from", "--pull-never", "-q", base).stdout.strip()
        try:
            store.run("add", ctr, str(tarball), "/")
            store.run("commit", "-q", "--rm", ctr, ref)
        finally:
            store.run("rm", ctr, check=False)
    return ref


@dataclass(frozen=True)
class Install:
    """A harness's install as a layer takes it: its files, and the system libraries they load
    (:func:`~infra.harnesses.libraries.shared_libraries`). Listing them runs the harness's
    interpreter and ``ldd`` (seconds): list once per harness, add to many images."""

    name: str
    files: list[Path]
    libraries: list[Path]


def install_of(harness: Harness) -> Install:
    files = harness.install_files()
    return Install(harness.name, files, shared_libraries(files) if files else [])


def with_install(store: ImageStore, base: str, install: Install) -> str:
    """``base`` with the install added (:func:`add_files`); ``base`` itself when the harness
    installs nothing of its own."""
    if not install.files:
        return base
    return add_files(store, base, install.files, install.name, install.libraries)
