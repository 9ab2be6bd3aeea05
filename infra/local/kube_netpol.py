"""The real node's NetworkPolicy agent: kube-router's firewall (``--run-firewall`` only: no
routing, no service proxy), built by ``scripts/setup k8s``, which turns each
``networking.k8s.io/v1`` NetworkPolicy into iptables rules and ipsets for the pods on this node.

kube-router writes a pod's rules once it sees the pod with an IP, a moment after its sandbox
starts: a pod's first container could run before them. So the agent also keeps a *canary*, a
TCP port on the node's gateway that no policy allows: a pod whose connection to it is refused
is confined (:attr:`PolicyAgent.canary`; the Kubernetes backend's first container waits for
that before the agent's container starts: ``PodSettings.egress_canary``).

Its rules are global to this machine (one agent per machine); :meth:`stop` removes them and its
ipsets.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from pathlib import Path

from infra.local.process import ServiceProcess, free_port, healthz

# What kube-router's firewall makes (chains, and the jumps to them) and its ipsets' prefix.
_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
_IPSETS = ("KUBE-SRC-", "KUBE-DST-")


class PolicyAgent:
    """kube-router's firewall for one node, and the canary (see the module docstring)."""

    def __init__(self, binary: Path, kubeconfig: Path, node: str, gateway: str, log: Path):
        self.binary, self.kubeconfig, self.node, self.gateway = binary, kubeconfig, node, gateway
        self.log = log
        self.health_port = free_port()
        self._process: ServiceProcess | None = None
        self._canary: socket.socket | None = None

    @property
    def canary(self) -> str:
        """``HOST:PORT``: open to this machine, refused to a pod under any NetworkPolicy."""
        assert self._canary is not None, "the policy agent is not started"
        return f"{self.gateway}:{self._canary.getsockname()[1]}"

    def start(self) -> None:
        self._open_canary()
        self._process = ServiceProcess("kube-router", [
            str(self.binary), f"--kubeconfig={self.kubeconfig}", "--run-firewall=true",
            "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
            f"--hostname-override={self.node}", f"--health-port={self.health_port}",
            "--metrics-port=0", "--enable-ipv6=false",
        ], self.log)  # fmt: skip
        self._process.start()
        self._process.wait_ready(lambda: healthz(self.health_port), 60)

    def _open_canary(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.gateway, 0))
        sock.listen(64)
        self._canary = sock

        def accept() -> None:  # every connection that gets through is closed at once
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=accept, name="netpol-canary", daemon=True).start()

    def check_alive(self) -> None:
        if self._process is not None:
            self._process.check_alive()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop(grace=5.0)
            self._process = None
        if self._canary is not None:
            with contextlib.suppress(OSError):
                self._canary.shutdown(socket.SHUT_RDWR)
            self._canary.close()
            self._canary = None
        remove_rules()


def remove_rules() -> None:
    """Every iptables rule and chain and every ipset kube-router's firewall made."""
    saved = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True)
    if saved.returncode != 0:
        return
    kept = [
        line for line in saved.stdout.splitlines()
        if not any(c in line for c in _CHAINS) and "kube-router netpol" not in line
    ]  # fmt: skip
    if len(kept) != len(saved.stdout.splitlines()):
        subprocess.run(["iptables-restore"], input="\n".join(kept) + "\n", text=True,
                       capture_output=True)  # fmt: skip
    names = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True).stdout
    for name in names.split():
        if name.startswith(_IPSETS):
            subprocess.run(["ipset", "destroy", name], capture_output=True)
