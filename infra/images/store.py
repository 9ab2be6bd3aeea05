"""The local OCI image store: buildah (Debian's package; daemonless, no Docker engine) over one
storage directory under the cache.

Every image OpenForge builds or imports lives in ``$OPENFORGE_CACHE/images/storage``
(``$OPENFORGE_IMAGES/storage`` where that is set) (overlay
driver; ``vfs`` where overlay mounts are not allowed), never in the machine's default store, so
nothing here touches a user's own podman or buildah images. An image's root filesystem is given
to the container sandbox as a directory (:meth:`ImageStore.rootfs`): one working container per
image, mounted once and never run, whose tree the sandbox uses as the read-only lower layer of
each rollout's own writable overlay.

Needs root, or a user with subordinate id ranges (Debian's ``uidmap``; ``useradd`` writes them)
for buildah's rootless mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from infra.paths import images_dir
from schemas.errors import SetupError

INSTALL_HINT = (
    "install Debian's container tools: `apt-get install buildah runc uidmap mmdebstrap` "
    "(as root), or run `scripts/setup images`"
)


@dataclass(frozen=True)
class ImageConfig:
    """What an image says about how its processes run (the OCI image config)."""

    image_id: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    cmd: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()


def _env_pairs(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, _, value = item.partition("=")
        out[key] = value
    return out


class ImageStore:
    """buildah over ``root`` (default: the cache's image storage)."""

    def __init__(self, root: Path | None = None, driver: str | None = None) -> None:
        self.root = root or images_dir() / "storage"
        self.driver = driver or os.environ.get("OPENFORGE_STORAGE_DRIVER", "overlay")

    @cached_property
    def buildah(self) -> str:
        found = shutil.which("buildah")
        if found is None:
            raise SetupError(f"buildah is not installed: {INSTALL_HINT}")
        return found

    def preflight(self) -> None:
        """SetupError unless buildah is installed and its storage can be used here."""
        self.run("images", "-q")

    def argv(self, *args: str) -> list[str]:
        run = self.root.parent / "run"
        return [
            self.buildah,
            "--root",
            str(self.root),
            "--runroot",
            str(run),
            "--storage-driver",
            self.driver,
            *args,
        ]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(self.argv(*args), capture_output=True, text=True)
        if check and done.returncode != 0:
            raise SetupError(
                f"buildah {' '.join(args[:2])} failed (exit {done.returncode}): "
                f"{done.stderr.strip()[-2000:]}"
            )
        return done

    def exists(self, ref: str) -> bool:
        return self.run("inspect", "--type", "image", ref, check=False).returncode == 0

    def config(self, ref: str) -> ImageConfig:
        """The image's config (ENV, WORKDIR, USER, CMD); SetupError if it is not in the store."""
        data = json.loads(self.run("inspect", "--type", "image", ref).stdout)
        conf = (data.get("OCIv1") or {}).get("config") or {}
        return ImageConfig(
            image_id=str(data.get("FromImageID") or data.get("ImageID") or ""),
            env=_env_pairs(conf.get("Env")),
            workdir=conf.get("WorkingDir") or None,
            user=conf.get("User") or None,
            cmd=tuple(conf.get("Cmd") or ()),
            entrypoint=tuple(conf.get("Entrypoint") or ()),
        )

    def image_id(self, ref: str) -> str:
        return self.run(
            "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref
        ).stdout.strip()

    def label(self, ref: str, key: str) -> str | None:
        """The image's label ``key`` (None: no such label, or no such image)."""
        done = self.run("inspect", "--type", "image", ref, check=False)
        if done.returncode != 0:
            return None
        conf = (json.loads(done.stdout).get("OCIv1") or {}).get("config") or {}
        value = (conf.get("Labels") or {}).get(key)
        return None if value is None else str(value)

    def import_rootfs(
        self, tarball: Path, ref: str, env: dict[str, str], cmd: str, labels: dict[str, str]
    ) -> None:
        """A single-layer image ``ref`` from a root filesystem tarball (a base image)."""
        ctr = self.run("from", "scratch").stdout.strip()
        try:
            self.run("add", ctr, str(tarball), "/")
            conf = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
            conf += [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
            self.run("config", *conf, "--cmd", cmd, ctr)
            self.run("commit", "-q", "--rm", ctr, ref)
        finally:
            self.run("rm", ctr, check=False)

    def rootfs(self, ref: str) -> Path:
        """The root filesystem of image ``ref`` as a directory (read it, never write it)."""
        name = "openforge-rootfs-" + self.image_id(ref)[:24]
        if self.run("inspect", "--type", "container", name, check=False).returncode != 0:
            self.run("from", "--name", name, "--pull-never", "-q", ref)
        return Path(self.run("mount", name).stdout.strip())

    def remove(self, ref: str) -> None:
        self.run("rmi", "-f", ref, check=False)
