"""A local OCI image registry: CNCF distribution's ``registry``, built by ``scripts/setup k8s``.

What a user's cluster pulls task images from is their own registry; this one stands in for it
on one machine (``openforge services up --registry``, and the tests of
``openforge tasks build --push``). It serves the Docker/OCI distribution API over plain HTTP on
``127.0.0.1:PORT``, which a node's containerd pulls from without TLS because the host is local,
and keeps its blobs under ``root``.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from infra import paths
from infra.local.process import LocalService, ServiceProcess, free_port
from schemas.errors import SetupError


def registry_binary() -> Path:
    """The ``registry`` program ``scripts/setup k8s`` built."""
    version = paths.versions()["REGISTRY_VERSION"]
    binary = paths.k8s_dir() / "bin" / "registry"
    if not (binary.parent / f".registry-{version}").exists():
        raise SetupError(
            f"the image registry {version} is not built in {binary.parent}: run `scripts/setup k8s`"
        )
    return binary


class LocalRegistry(LocalService):
    """A registry at ``http://127.0.0.1:PORT``, storing under ``root``."""

    description = "image registry"

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"

    def _config(self) -> str:
        """distribution's configuration (YAML; JSON is YAML): filesystem storage, deletes
        allowed, HTTP on the loopback address only."""
        config = {
            "version": 0.1,
            "log": {"level": "warn"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host},
        }
        return json.dumps(config)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(self._config())
        self._process = ServiceProcess(
            "registry", [str(registry_binary()), "serve", str(config)], self.root / "registry.log"
        )
        self._process.start()
        self._process.wait_ready(self._ready, timeout=30)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as resp:
            return bool(resp.status == 200)

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
