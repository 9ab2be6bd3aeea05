"""Where images built here go so that a cluster's nodes run them: an image sink.

A sink is named by a URL (``--kube-image-sink``):

- ``containerd:///path/to/containerd.sock``: a node's containerd on this machine (the local
  cluster's real node: ``openforge services up --kube`` prints its URL). The image is exported
  from the local image store as an OCI archive and imported into containerd's ``k8s.io``
  namespace, where the kubelet's CRI finds it; pods run it with ``imagePullPolicy:
  IfNotPresent``.
- ``registry://HOST[:PORT][/PREFIX]``: an OCI registry the cluster's nodes pull from (a user's
  own, or the one ``openforge services up --registry`` starts). The image is pushed there as
  ``HOST[:PORT]/PREFIX/openforge/task:<digest>`` (its local name with ``localhost/`` replaced),
  over TLS unless the host is this machine's loopback (plain HTTP, as containerd pulls it).
  Credentials come from buildah's usual auth file (``$REGISTRY_AUTH_FILE``, or
  ``buildah login``).

Images are named by their content (``localhost/openforge/task:<digest>``), so a sink that holds a
reference already holds that image: :meth:`ImageSink.publish` is then a lookup.
"""

from __future__ import annotations

import abc
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from infra.images.store import ImageStore
from schemas.errors import ConfigError, SetupError

CRI_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI's images and containers


class ImageSink(abc.ABC):
    """Makes images of the local store runnable by a cluster's nodes."""

    url: str

    @abc.abstractmethod
    def publish(self, ref: str) -> str:
        """Make local image ``ref`` runnable by the cluster; returns the reference pods use."""

    @abc.abstractmethod
    def holds(self, ref: str) -> bool:
        """Whether the cluster's side already has ``ref`` (as :meth:`publish` returned it)."""


class ContainerdSink(ImageSink):
    """A containerd on this machine, reached at its socket (see the module docstring)."""

    def __init__(self, socket: Path, store: ImageStore | None = None) -> None:
        self.socket = socket
        self.url = f"containerd://{socket}"
        self.store = store or ImageStore()
        self._lock = threading.Lock()  # one import at a time: each reads the whole image

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``ctr`` on this containerd, in the CRI's namespace."""
        argv = ["ctr", "--address", str(self.socket), "--namespace", CRI_NAMESPACE, *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError as exc:
            raise SetupError(
                "ctr (containerd's client) is not installed: `apt-get install containerd`"
            ) from exc

    def holds(self, ref: str) -> bool:
        return ref in self.ctr("images", "ls", "-q").stdout.split()

    def publish(self, ref: str) -> str:
        with self._lock:
            if self.holds(ref):
                return ref
            with tempfile.TemporaryDirectory(prefix="openforge-image-") as tmp:
                archive = Path(tmp) / "image.tar"
                self.store.run("push", "-q", ref, f"oci-archive:{archive}:{ref}")
                done = self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
            if done.returncode != 0:
                raise SetupError(
                    f"importing {ref} into containerd at {self.socket} failed: "
                    f"{done.stderr.strip()[-1000:]}"
                )
        return ref


LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
MANIFESTS = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))  # fmt: skip


class RegistrySink(ImageSink):
    """An OCI registry (see the module docstring)."""

    def __init__(self, host: str, prefix: str = "", store: ImageStore | None = None) -> None:
        self.host, self.prefix = host, prefix.strip("/")
        self.url = f"registry://{host}" + (f"/{self.prefix}" if self.prefix else "")
        self.plain_http = host.rsplit(":", 1)[0] in LOOPBACK
        self.store = store or ImageStore()

    def remote(self, ref: str) -> str:
        """Where local image ``ref`` goes: ``localhost/`` (buildah's name for an image made
        here) replaced by the registry and its prefix."""
        name = ref.removeprefix("localhost/")
        return "/".join(p for p in (self.host, self.prefix, name) if p)

    def holds(self, ref: str) -> bool:
        """Whether the registry answers for the manifest (a HEAD, anonymous: a registry that
        wants credentials for reads says no, and :meth:`publish` pushes again, a no-op for
        blobs it has)."""
        name, _, tag = ref.removeprefix(self.host + "/").rpartition(":")
        scheme = "http" if self.plain_http else "https"
        request = urllib.request.Request(
            f"{scheme}://{self.host}/v2/{name}/manifests/{tag}", method="HEAD",
            headers={"Accept": MANIFESTS},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def publish(self, ref: str) -> str:
        target = self.remote(ref)
        if self.holds(target):
            return target
        tls = "false" if self.plain_http else "true"
        done = self.store.run(
            "push", "-q", f"--tls-verify={tls}", ref, f"docker://{target}", check=False
        )
        if done.returncode != 0:
            raise SetupError(
                f"pushing {ref} to {target} failed: {done.stderr.strip()[-1000:]}; check that the "
                "registry is up and that buildah has its credentials (`buildah login HOST`)"
            )
        return target


def image_sink(url: str, store: ImageStore | None = None) -> ImageSink:
    """The sink ``url`` names; ConfigError (saying which are known) for any other."""
    parsed = urlparse(url)
    if parsed.scheme == "containerd" and parsed.path:
        socket = Path(parsed.netloc + parsed.path) if parsed.netloc else Path(parsed.path)
        if not socket.exists():
            raise ConfigError(
                f"image sink {url}: no containerd socket at {socket}: start the local cluster "
                "with `openforge services up --kube` and use the sink URL it prints"
            )
        return ContainerdSink(socket, store)
    if parsed.scheme == "registry" and parsed.netloc:
        return RegistrySink(parsed.netloc, parsed.path, store)
    raise ConfigError(
        f"image sink {url!r} is not one OpenForge knows: use containerd:///PATH/TO/containerd.sock "
        "(a node's containerd on this machine) or registry://HOST[:PORT][/PREFIX] (a registry "
        "the cluster pulls from)"
    )
