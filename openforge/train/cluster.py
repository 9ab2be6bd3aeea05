"""The cluster ``openforge train`` runs its rollouts on when ``rollouts.backend = "kubernetes"``.

With ``kubernetes.kubeconfig`` empty (the default) the run starts the local cluster itself, as it
starts vLLM: a control plane and one real kubelet node on containerd and runc (root; `scripts/setup
k8s` and `scripts/setup images` install them), under ``services/kube/`` of the run directory,
stopped with the run. Its node gives the rest: the address pods reach this machine at (the proxy
listens there, and the rollout NetworkPolicy lets pods reach that address and port only), the
node's containerd as the image sink (each task's image is built here with the harness's install
added, and imported there), and the egress canary a pod waits on until it is confined.

With a kubeconfig, the cluster is the user's: ``kubernetes.proxy_host`` is required (an address
of this machine its pods reach), ``image_sink`` and ``egress_canary`` are optional.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.images import ImagePolicy
from openforge.train.config import TrainConfig
from orchestrator.backend import RolloutBackendName
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions
from schemas.errors import ConfigError


@dataclass(frozen=True)
class RolloutCluster:
    """Where rollout pods run and how they reach the run's proxy."""

    kubeconfig: Path
    namespace: str
    proxy_host: str  # the proxy listens here; pods call http://proxy_host:PORT
    image_sink: str | None
    egress_canary: str | None
    cpu_request: float = 1.0

    def options(self, proxy_port: int, images: ImagePolicy) -> KubeOptions:
        """The Kubernetes backend's section for a proxy listening at ``proxy_port``."""
        return KubeOptions(
            kubeconfig=self.kubeconfig,
            pod=PodSettings(
                namespace=self.namespace,
                proxy_url=f"http://{self.proxy_host}:{proxy_port}",
                egress_canary=self.egress_canary,
                cpu_request=self.cpu_request,
            ),
            proxy_port=proxy_port,
            proxy_cidr=f"{_address(self.proxy_host)}/32",
            image_sink=self.image_sink,
            images=images,
        )


def _address(host: str) -> str:
    """``host`` as an IPv4 address (the NetworkPolicy takes address blocks, not names)."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ConfigError(
            f"kubernetes.proxy_host {host!r} does not resolve ({exc}): give an address of this "
            "machine that the cluster's pods reach"
        ) from exc


@contextmanager
def rollout_cluster(
    cfg: TrainConfig, root: Path, say: Callable[[str], None] = print
) -> Iterator[RolloutCluster | None]:
    """The run's cluster (None on the local backend); a local one is stopped on exit."""
    kube = cfg.kubernetes
    if cfg.rollouts.backend is not RolloutBackendName.KUBERNETES:
        yield None
        return
    if kube.kubeconfig:
        cluster = RolloutCluster(
            Path(kube.kubeconfig), kube.namespace, kube.proxy_host,
            kube.image_sink or None, kube.egress_canary or None, kube.cpu_request,
        )  # fmt: skip
        yield cluster
        return
    from infra.local.kube import LocalKube

    where = root / "services" / "kube"
    shutil.rmtree(where, ignore_errors=True)  # each launch its own cluster
    say("starting the local Kubernetes cluster (a real kubelet node; about 10 s)")
    with LocalKube(root=where, nodes=0, real_nodes=1) as local:
        node = local.real_node
        assert node is not None  # real_nodes=1
        cluster = RolloutCluster(
            local.kubeconfig, kube.namespace, kube.proxy_host or node.gateway,
            kube.image_sink or node.sink.url, kube.egress_canary or node.policy.canary,
            kube.cpu_request,
        )  # fmt: skip
        say(f"kube at {local.server} (KUBECONFIG={local.kubeconfig}); pods reach the proxy at "
            f"{cluster.proxy_host}; images to {cluster.image_sink}")  # fmt: skip
        yield cluster
