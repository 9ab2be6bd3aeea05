"""The real node's Service routing: kube-proxy in iptables mode, built by ``scripts/setup k8s``,
which turns each Service's cluster IP and port into DNAT rules to the ready pods behind it. A
Service's cluster IP then reaches its pods from this machine and from every pod on the node,
as on any cluster; the cluster DNS (:mod:`infra.local.kube_dns`) gives pods their names.

The node's bridge passes bridged traffic through iptables (``net.bridge.bridge-nf-call-iptables``),
so a pod's reply to another pod that called it by a cluster IP is translated back on the way
(no masquerading: the NetworkPolicy agent still sees the calling pod's own address).

Its rules are global to this machine (one per machine, like the policy agent); :meth:`stop`
removes them (``kube-proxy --cleanup``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from infra.local.process import ServiceProcess, free_port, healthz
from schemas.errors import SetupError

BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


class ServiceRouting:
    """kube-proxy for one node (see the module docstring).

    Args:
        binary: the kube-proxy program.
        kubeconfig: how it reaches the API server (it watches Services and EndpointSlices).
        node: the Node's name.
        pod_cidr: the node's pod network (traffic from it is the cluster's own).
        log: where its output goes.
    """

    def __init__(self, binary: Path, kubeconfig: Path, node: str, pod_cidr: str, log: Path):
        self.binary, self.kubeconfig, self.node, self.pod_cidr = binary, kubeconfig, node, pod_cidr
        self.log = log
        self.health_port = free_port()
        self._process: ServiceProcess | None = None

    def preflight(self) -> None:
        if not self.binary.exists():
            raise SetupError(
                f"{self.binary} is missing: run `scripts/setup k8s` (it adds kube-proxy to a "
                "control plane built before it, ~1 minute)"
            )

    def start(self) -> None:
        self.preflight()
        if BRIDGE_NF.exists() and BRIDGE_NF.read_text().strip() != "1":
            BRIDGE_NF.write_text("1\n")  # replies between pods on the bridge are un-DNATed
        self._process = ServiceProcess("kube-proxy", [
            str(self.binary), f"--kubeconfig={self.kubeconfig}", "--proxy-mode=iptables",
            f"--hostname-override={self.node}", f"--cluster-cidr={self.pod_cidr}",
            f"--healthz-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}", "--nodeport-addresses=primary",
            "--conntrack-max-per-core=0",  # leave this machine's conntrack table as it is
        ], self.log)  # fmt: skip
        self._process.start()
        self._process.wait_ready(lambda: healthz(self.health_port), 60)

    def check_alive(self) -> None:
        if self._process is not None:
            self._process.check_alive()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.stop(grace=5.0)
        self._process = None
        subprocess.run(
            [str(self.binary), "--cleanup", "--proxy-mode=iptables"], capture_output=True
        )
