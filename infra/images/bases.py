"""The local catalogue of base images, made from Debian's packages with mmdebstrap.

No image registry is reachable from every machine (none is from CI's), so ``scripts/setup
images`` makes a small catalogue of base images from the Debian archive the machine's own apt
uses (its ``/etc/apt/sources.list*``), and a task's ``FROM`` resolves against it
(:mod:`infra.images.resolve`). Each is named as the official image it stands in for:

- ``debian:bookworm`` (also ``debian:12``): Debian's minimal base (``--variant=minbase``), as the
  official image is.
- ``debian:bookworm-slim`` (``debian:12-slim``): the same without documentation, manuals and
  locales, as the official slim image.
- ``python:3.11-slim`` (``python:3.11-slim-bookworm``): bookworm-slim with Debian's Python 3.11,
  pip, venv and CA certificates, laid out as the official image is used: ``python`` and ``pip`` on
  PATH, and pip allowed to install into the system (Debian's ``EXTERNALLY-MANAGED`` marker
  removed, as it is absent from the official image). The official image's interpreter is built
  from source under ``/usr/local``; this one is Debian's, under ``/usr``.

Each also carries this machine's way to the package registries (:func:`machine_trust`: the
certificate authorities it adds and its pip configuration), so that a build's ``RUN apt-get`` and
``RUN pip`` reach them as the machine does.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.images.store import INSTALL_HINT, ImageStore
from schemas.errors import SetupError

SUITE = "bookworm"
RECIPE_LABEL = "dev.openforge.recipe"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SLIM = (
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
)
_NO_LISTS = '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'


@dataclass(frozen=True)
class BaseImage:
    """One catalogue entry: its name, the names it also answers to, and how mmdebstrap makes it."""

    name: str
    aliases: tuple[str, ...]
    options: tuple[str, ...]
    cmd: str = "bash"

    @property
    def ref(self) -> str:
        """Its name in the local store."""
        return f"localhost/{self.name}"


CATALOGUE: tuple[BaseImage, ...] = (
    BaseImage("debian:bookworm", ("debian:12",), ("--variant=minbase", _NO_LISTS)),
    BaseImage(
        "debian:bookworm-slim", ("debian:12-slim",), ("--variant=minbase", *_SLIM, _NO_LISTS)
    ),
    BaseImage(
        "python:3.11-slim",
        ("python:3.11-slim-bookworm", "python:3.11"),
        (
            "--variant=minbase",
            *_SLIM,
            "--include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates",
            '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
            _NO_LISTS,
        ),
        cmd="python3",
    ),
)


def by_name() -> dict[str, BaseImage]:
    """Every name (and alias) of the catalogue, to its entry."""
    out: dict[str, BaseImage] = {}
    for base in CATALOGUE:
        for name in (base.name, *base.aliases):
            out[name] = base
    return out


def apt_sources() -> list[str]:
    """The machine's own Debian sources files (what its apt uses), for mmdebstrap."""
    found = [p for p in ("/etc/apt/sources.list",) if Path(p).is_file() and Path(p).stat().st_size]
    found += sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    found += sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    if not found:
        raise SetupError(
            "no apt sources on this machine (/etc/apt/sources.list*): mmdebstrap needs a Debian "
            "archive to make the base images from"
        )
    return found


def machine_trust() -> list[str]:
    """mmdebstrap hooks that give an image this machine's way to the package registries: the
    certificate authorities it adds (``/usr/local/share/ca-certificates``, e.g. an egress
    proxy's), its CA bundle, and its pip configuration. Without them ``RUN pip install`` in a
    build fails where the machine's own pip works."""
    hooks: list[str] = []
    extra = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    if extra:
        hooks.append('--customize-hook=mkdir -p "$1"/usr/local/share/ca-certificates')
        hooks.append(f"--customize-hook=copy-in {' '.join(extra)} /usr/local/share/ca-certificates")
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    if Path(bundle).is_file():
        hooks.append('--customize-hook=mkdir -p "$1"/etc/ssl/certs')
        hooks.append(f"--customize-hook=copy-in {bundle} /etc/ssl/certs")
    if Path("/etc/pip.conf").is_file():
        hooks.append("--customize-hook=copy-in /etc/pip.conf /etc")
    return hooks


def machine_env() -> dict[str, str]:
    """The image's ENV: a standard PATH and locale, and where the machine adds certificate
    authorities, ``SSL_CERT_FILE`` (tools with their own trust store, such as uv, read it)."""
    env = {"PATH": PATH, "LANG": "C.UTF-8"}
    if glob.glob("/usr/local/share/ca-certificates/*.crt"):
        env["SSL_CERT_FILE"] = "/etc/ssl/certs/ca-certificates.crt"
    return env


def recipe(base: BaseImage) -> str:
    """A digest of everything that decides the image: remade when it changes."""
    parts = [SUITE, *base.options, *machine_trust(), json.dumps(machine_env()), base.cmd]
    for path in (*glob.glob("/usr/local/share/ca-certificates/*.crt"), "/etc/pip.conf"):
        if Path(path).is_file():
            parts.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def make(base: BaseImage, store: ImageStore, say: Callable[[str], None] = print) -> float:
    """Make ``base`` with mmdebstrap and import it into ``store``; the seconds it took."""
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise SetupError(f"mmdebstrap is not installed: {INSTALL_HINT}")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="openforge-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        argv = [mmdebstrap, "--quiet", *base.options, *machine_trust(), SUITE, str(tarball)]
        argv += apt_sources()
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise SetupError(
                f"mmdebstrap could not make {base.name} (exit {done.returncode}): "
                f"{done.stderr.strip()[-2000:]}"
            )
        labels = {RECIPE_LABEL: recipe(base)}
        store.import_rootfs(tarball, base.ref, machine_env(), base.cmd, labels)
    seconds = time.monotonic() - start
    say(f"made base image {base.name} in {seconds:.0f}s")
    return seconds


def ensure_catalogue(store: ImageStore, say: Callable[[str], None] = print) -> list[str]:
    """Make every catalogue image the store lacks, or has from another recipe (an older
    OpenForge, other machine certificates); the names made (none when all are current)."""
    made = []
    for base in CATALOGUE:
        if store.label(base.ref, RECIPE_LABEL) != recipe(base):  # missing, or made otherwise
            make(base, store, say)
            made.append(base.name)
    return made


def main() -> None:
    """Make what the catalogue lacks (`scripts/setup images`)."""
    store = ImageStore()
    start = time.monotonic()
    made = ensure_catalogue(store, say=lambda line: print(f"    {line}", flush=True))
    names = ", ".join(b.name for b in CATALOGUE)
    took = f"made {len(made)} in {time.monotonic() - start:.0f}s" if made else "all present"
    print(f"    ok base images {names} in {store.root} ({took})")


if __name__ == "__main__":
    main()
