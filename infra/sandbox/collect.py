"""Copy paths out of a sandbox after its command ended (``SandboxSpec.collect``): Harbor's
artifacts. A path under one of the spec's mounts is read from the host directory behind it;
any other from the image's root filesystem as the run left it (the container sandbox's layer,
before it is removed; bubblewrap has none, so such a path is skipped there). Symbolic links are
copied as links, never followed, so nothing outside the sandbox's tree is read."""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path

from infra.sandbox.base import SandboxSpec


def host_path(spec: SandboxSpec, inside: str, rootfs: Path | None) -> Path | None:
    """Where ``inside`` is on the host: behind the deepest mount that holds it, else in
    ``rootfs``; None when neither holds it."""
    best = None
    for m in spec.mounts:
        if (inside == m.inside or inside.startswith(m.inside + "/")) and (
            best is None or len(m.inside) > len(best.inside)
        ):
            best = m
    if best is not None:
        rest = posixpath.relpath(inside, best.inside)
        base, path = best.host, (best.host if rest == "." else best.host / rest)
    elif rootfs is not None:
        base, path = rootfs, rootfs / inside.lstrip("/")
    else:
        return None
    # A directory on the way may have been replaced by a link (the agent owns its tree): its
    # parents must resolve inside the sandbox's own tree, never to another host path.
    if path != base and not Path(os.path.realpath(path.parent)).is_relative_to(
        os.path.realpath(base)
    ):
        return None
    return path


def collect(spec: SandboxSpec, rootfs: Path | None) -> list[str]:
    """Copy each of ``spec.collect``; the inside paths that were not there."""
    missing = []
    for inside, target, exclude in spec.collect:
        source = host_path(spec, posixpath.normpath(inside), rootfs)
        if source is None or not (source.exists() or source.is_symlink()):
            missing.append(inside)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            ignore = shutil.ignore_patterns(*exclude) if exclude else None
            shutil.copytree(source, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target, follow_symlinks=False)
    return missing
