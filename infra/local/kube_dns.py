"""The real node's cluster DNS: CoreDNS with its ``kubernetes`` plugin, built by ``scripts/setup
k8s`` (a minimal build: bind, health, ready, errors, log, kubernetes, forward), listening on the
node's gateway, port 53. The kubelet names that address as the cluster's DNS (``clusterDNS``), so
a pod with the default ``dnsPolicy: ClusterFirst`` resolves ``SERVICE.NAMESPACE.svc.cluster.local``
(and ``SERVICE`` within its own namespace, through the search path) to the Service's cluster IP,
which kube-proxy routes (:mod:`infra.local.kube_services`); other names are forwarded to this
machine's resolver.

On a cluster, CoreDNS runs as pods behind the ``kube-dns`` Service; here it is a process of this
machine like the node's other agents. A pod under a NetworkPolicy reaches it only if the policy
allows egress to the node's gateway on port 53: the rollout pods' policy on the local cluster
does not (their egress is the proxy's port alone), so an agent resolves no name.

It reads Services, EndpointSlices and Namespaces as a user of its own
(:data:`USER`, bound to :func:`rbac_objects`' ClusterRole).
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from infra.local.process import ServiceProcess, free_port

DOMAIN = "cluster.local"
USER = "system:openforge:cluster-dns"  # its certificate's CN (infra/local/kube_pki.py)


def rbac_objects() -> list[tuple[str, dict[str, Any]]]:
    """``(collection path, object)`` of the ClusterRole CoreDNS's kubernetes plugin needs (what
    upstream's deployment grants, read-only) and its binding to :data:`USER`."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "openforge:cluster-dns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "namespaces"],
             "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["list", "watch"]},
        ],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "openforge:cluster-dns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "openforge:cluster-dns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }  # fmt: skip
    return [(f"{rbac}/clusterroles", role), (f"{rbac}/clusterrolebindings", binding)]


class ClusterDNS:
    """CoreDNS for one node (see the module docstring).

    Args:
        binary: the CoreDNS program.
        kubeconfig: how it reaches the API server, as :data:`USER`.
        address: where it listens (the node's gateway), port 53.
        root: where its Corefile is written.
        log: where its output goes.
    """

    def __init__(self, binary: Path, kubeconfig: Path, address: str, root: Path, log: Path):
        self.binary, self.kubeconfig, self.address = binary, kubeconfig, address
        self.root, self.log = root, log
        self.health_port, self.ready_port = free_port(), free_port()
        self._process: ServiceProcess | None = None

    def corefile(self) -> str:
        """The cluster's zone (and reverse lookups of its addresses) from the API server;
        every other name forwarded to this machine's resolver."""
        return f"""{DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {self.address}
    errors
    health 127.0.0.1:{self.health_port}
    ready 127.0.0.1:{self.ready_port}
    kubernetes {DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig} local
        ttl 5
    }}
}}
.:53 {{
    bind {self.address}
    errors
    forward . /etc/resolv.conf
}}
"""

    def start(self) -> None:
        """Start CoreDNS (its binary checked by :meth:`RealNode.preflight`) and wait until its
        kubernetes plugin has synced."""
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "Corefile"
        conf.write_text(self.corefile())
        self._process = ServiceProcess("coredns", [str(self.binary), "-conf", str(conf)], self.log)
        self._process.start()
        self._process.wait_ready(self._ready, 60)

    def _ready(self) -> bool:
        """Whether its kubernetes plugin has synced with the API server (``ready``)."""
        url = f"http://127.0.0.1:{self.ready_port}/ready"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)

    def check_alive(self) -> None:
        if self._process is not None:
            self._process.check_alive()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop(grace=5.0)
            self._process = None
