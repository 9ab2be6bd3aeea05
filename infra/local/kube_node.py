"""A real Kubernetes node beside the local control plane: the kubelet on Debian's containerd
(its CRI plugin), runc and CNI bridge, so that a pod's containers really run.

with LocalKube(real_nodes=1) as kube:   # starts a RealNode (``openforge-node-0``)
    kube.real_node.load_image("localhost/openforge/task:...")   # from the image store

Everything is the node's own: containerd's root, state and socket, the CNI network (a bridge
``ofk<id>`` on a /24 of its own, IPs from a host-local store under the node's directory) and the
kubelet's root, certificates and ports. The pod sandbox ("pause") image cannot be pulled (no
registry is reachable): it is made from the static program ``scripts/setup k8s`` builds. Images
come from the local image store (:mod:`infra.images`), exported as OCI archives and imported
into containerd's ``k8s.io`` namespace; pods run them with ``imagePullPolicy: IfNotPresent``.
Once the node is registered, kube-router enforces NetworkPolicies (:mod:`infra.local.kube_netpol`),
kube-proxy routes Services' cluster IPs (:mod:`infra.local.kube_services`) and CoreDNS, the
kubelet's ``clusterDNS``, resolves their names (:mod:`infra.local.kube_dns`). The kubelet,
kube-proxy and CoreDNS each hold a credential of their own (:class:`NodeKubeconfigs`): the
kubelet is ``system:node:<name>``, which the API server's Node authorizer and NodeRestriction
admission bound to its node and its pods' objects.

What this machine needs, set here (``../shared/notes/platform.md`` section 11):

- cgroup v1 (a tmpfs ``/sys/fs/cgroup`` with v1 controllers): ``failCgroupV1: false``, the
  ``cgroupfs`` driver and no QoS cgroups;
- ``restrict_oom_score_adj = true`` in containerd's CRI: without it every pod sandbox fails
  ("runc create failed: ... can't get final child's PID from pipe: EOF"), because the kubelet
  asks for an ``oom_score_adj`` this machine does not allow;
- the kubelet cannot raise its open-files limit (it warns and goes on).

Needs root (containerd, runc and the CNI plugins make namespaces, cgroups and links). :meth:`stop`
deletes every pod, stops the kubelet and containerd, kills whatever they left, unmounts and
removes the node's directory, and deletes the bridge.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.images import ImageStore
from infra.images.sinks import ContainerdSink
from infra.local.kube_dns import DOMAIN, ClusterDNS
from infra.local.kube_netpol import PolicyAgent
from infra.local.kube_services import ServiceRouting
from infra.local.process import ServiceProcess, free_port, healthz, kill_tagged, tail
from schemas.errors import ServiceError, SetupError

PAUSE_IMAGE = "localhost/openforge/pause:1"
CNI_BIN = Path("/usr/lib/cni")
INSTALL_HINT = (
    "a real node needs Debian's containerd, runc and CNI plugins: `apt-get install containerd "
    "runc containernetworking-plugins` (as root), or run `scripts/setup images`"
)


def _subnet() -> str:
    """A /24 in 10.88.0.0/16 that no route on this machine uses yet."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    free = [n for n in range(1, 255) if f"10.88.{n}." not in routes]
    if not free:
        raise ServiceError("no free /24 in 10.88.0.0/16 for a node's pod network")
    return f"10.88.{random.choice(free)}.0/24"


@dataclass(frozen=True)
class NodeKubeconfigs:
    """Who each of the node's programs is to the API server."""

    kubelet: Path  # system:node:NAME in system:nodes: the Node authorizer, NodeRestriction
    service_proxy: Path  # system:kube-proxy: the bootstrap RBAC's system:node-proxier
    policy_agent: Path  # kube-router: the admin's (no ClusterRole of its own is made for it)
    cluster_dns: Path  # CoreDNS: infra.local.kube_dns.USER, read-only on Services and the like


class RealNode:
    """One kubelet node on containerd (see the module docstring).

    Args:
        root: where the node's logs go (its working directory, with containerd's and the
            kubelet's sockets, is a fresh one under the temporary directory, removed on stop).
        kubeconfigs: how the kubelet and the node's agents reach the API server, each as itself.
        client_ca: the CA whose client certificates the kubelet's API accepts (the API
            server's, for logs and exec).
        bin_dir: where ``scripts/setup k8s`` put ``kubelet`` and ``pause``.
        name: the node's name (the kubelet's certificate names it).
    """

    def __init__(
        self, root: Path, kubeconfigs: NodeKubeconfigs, client_ca: Path, bin_dir: Path, name: str
    ) -> None:
        self.logs, self.client_ca = root / "logs", client_ca
        self.kubeconfig = kubeconfigs.kubelet
        # Sockets live under it (a unix socket's path is at most 107 bytes): short, in /tmp.
        self.root = Path(tempfile.mkdtemp(prefix="openforge-node-"))
        self.bin_dir, self.name = bin_dir, name
        self.node_id = uuid.uuid4().hex[:8]
        self.bridge = f"ofk{self.node_id}"
        self.subnet = _subnet()
        self.port, self.healthz_port = free_port(), free_port()
        self._containerd: ServiceProcess | None = None
        self._kubelet: ServiceProcess | None = None
        self.policy = PolicyAgent(
            bin_dir / "kube-router", kubeconfigs.policy_agent, name, self.gateway,
            self.logs / "kube-router.log",
        )  # fmt: skip
        self.services = ServiceRouting(
            bin_dir / "kube-proxy", kubeconfigs.service_proxy, name, self.subnet,
            self.logs / "kube-proxy.log",
        )  # fmt: skip
        self.dns = ClusterDNS(
            bin_dir / "coredns", kubeconfigs.cluster_dns, self.gateway, self.root / "dns",
            self.logs / "coredns.log",
        )  # fmt: skip

    # -- where things are ------------------------------------------------------------------------
    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def gateway(self) -> str:
        """The host's address on the pod network: what a pod reaches this machine by."""
        return self.subnet.rsplit(".", 1)[0] + ".1"

    # -- lifecycle --------------------------------------------------------------------------------
    def preflight(self) -> None:
        missing = [
            t for t in ("containerd", "ctr", "runc", "ip", "iptables") if not shutil.which(t)
        ]
        missing += [p.name for p in (CNI_BIN / "bridge", CNI_BIN / "host-local") if not p.exists()]
        if missing:
            raise SetupError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
        if os.geteuid() != 0:
            raise SetupError(
                "a real node runs containers with containerd and runc, which need root here: "
                "run as root, or use kwok nodes (LocalKube(nodes=N), the default)"
            )
        for binary in ("kubelet", "pause", "kube-router", "kube-proxy", "coredns"):
            if not (self.bin_dir / binary).exists():
                raise SetupError(
                    f"{self.bin_dir / binary} is missing: run `scripts/setup k8s` (it adds the "
                    "real node's programs to a control plane built before them, ~6 minutes)"
                )

    def start(self) -> None:
        self.preflight()
        (self.logs).mkdir(parents=True, exist_ok=True)
        self._write_cni()
        self._make_bridge()
        self._start_containerd()
        self._import_pause()
        self._start_kubelet()

    def _write_cni(self) -> None:
        conf = {
            "cniVersion": "0.4.0",
            "name": f"openforge-{self.node_id}",
            "plugins": [
                {
                    "type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }  # fmt: skip
        (self.root / "cni" / "conf").mkdir(parents=True, exist_ok=True)
        (self.root / "cni" / "conf" / "10-openforge.conflist").write_text(json.dumps(conf))

    def _make_bridge(self) -> None:
        """The pod network's bridge, made before the first pod (CNI's bridge plugin takes it
        as it is): its address is the node's IP, where the API server reaches the kubelet (a
        node's IP may not be loopback) and pods reach this machine."""
        for argv in (
            ["ip", "link", "add", "name", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise ServiceError(f"{' '.join(argv)} failed: {done.stderr.strip()}")

    def _containerd_config(self) -> str:
        c = self.root / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{c / "root"}"
state = "{c / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{c / "ttrpc.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.root / "cni" / "conf"}"
"""

    def _start_containerd(self) -> None:
        c = self.root / "containerd"
        c.mkdir(parents=True, exist_ok=True)
        (c / "config.toml").write_text(self._containerd_config())
        self._containerd = ServiceProcess(
            "containerd", ["containerd", "--config", str(c / "config.toml")],
            self.logs / "containerd.log",
        )  # fmt: skip
        self._containerd.start()
        self._containerd.wait_ready(lambda: self.sink.ctr("version").returncode == 0, 30)

    @property
    def sink(self) -> ContainerdSink:
        """Where images go for this node's pods (see :mod:`infra.images.sinks`)."""
        return ContainerdSink(self.socket)

    def _import_pause(self) -> None:
        """The sandbox image, from the static pause program, made in the image store."""
        store = ImageStore()
        if not store.exists(PAUSE_IMAGE):
            ctr = store.run("from", "scratch").stdout.strip()
            try:
                store.run("copy", "--chmod", "0755", ctr, str(self.bin_dir / "pause"), "/pause")
                store.run("config", "--entrypoint", '["/pause"]', "--user", "65535", ctr)
                store.run("commit", "-q", "--rm", ctr, PAUSE_IMAGE)
            finally:
                store.run("rm", ctr, check=False)
        ContainerdSink(self.socket, store).publish(PAUSE_IMAGE)

    def load_image(self, ref: str) -> None:
        """Import image ``ref`` from the local image store into this node's containerd, where
        pods find it (``imagePullPolicy: IfNotPresent`` or ``Never``)."""
        self.sink.publish(ref)

    def images(self) -> list[str]:
        """The image references this node's containerd holds."""
        return [r for r in self.sink.ctr("images", "ls", "-q").stdout.split() if ":" in r]

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False, "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {
                "anonymous": {"enabled": False}, "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.client_ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "address": self.gateway, "port": self.port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "evictionHard": {}, "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "", "clusterDNS": [self.gateway], "clusterDomain": DOMAIN,
            "localStorageCapacityIsolation": True,
            "serializeImagePulls": False, "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s", "fileCheckFrequency": "10s",
        }  # fmt: skip

    def _start_kubelet(self) -> None:
        k = self.root / "kubelet"
        k.mkdir(parents=True, exist_ok=True)
        (k / "config.yaml").write_text(json.dumps(self._kubelet_config()))  # JSON is YAML
        self._kubelet = ServiceProcess("kubelet", [
            str(self.bin_dir / "kubelet"), f"--kubeconfig={self.kubeconfig}",
            f"--config={k / 'config.yaml'}", f"--hostname-override={self.name}",
            f"--node-ip={self.gateway}", f"--root-dir={k / 'root'}", f"--cert-dir={k / 'pki'}",
            "--node-labels=openforge.dev/node=real", "--v=1",
        ], self.logs / "kubelet.log")  # fmt: skip
        self._kubelet.start()
        self._kubelet.wait_ready(self._healthy, 60)

    def _healthy(self) -> bool:
        return healthz(self.healthz_port)

    def start_agents(self) -> None:
        """The NetworkPolicy agent (:mod:`infra.local.kube_netpol`), the Service routing
        (:mod:`infra.local.kube_services`) and the cluster DNS (:mod:`infra.local.kube_dns`),
        once the node is registered: the first two read its Node."""
        self.policy.start()
        self.services.start()
        self.dns.start()

    def check_alive(self) -> None:
        for proc in (self._containerd, self._kubelet):
            if proc is not None:
                proc.check_alive()
        self.policy.check_alive()
        self.services.check_alive()
        self.dns.check_alive()

    def restart_kubelet(self, down_s: float = 0.0) -> None:
        """Stop the kubelet, wait ``down_s``, start it again (a fault: its pods keep running)."""
        if self._kubelet is None:
            raise ServiceError("the node's kubelet is not running")
        self._kubelet.stop(grace=5.0)
        time.sleep(down_s)
        self._kubelet.start()
        self._kubelet.wait_ready(self._healthy, 60)

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {n}:\n{tail(self.logs / f'{n}.log', 15)}" for n in ("kubelet", "containerd")
        )

    # -- teardown ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the kubelet, remove every container and sandbox, stop containerd, and leave
        nothing: no process, mount, bridge, firewall rule or file of the node's."""
        self.dns.stop()
        self.services.stop()
        self.policy.stop()
        if self._kubelet is not None:
            self._kubelet.stop(grace=5.0)
            self._kubelet = None
        if self._containerd is not None:
            self._remove_containers()
            self._containerd.stop(grace=5.0)
            kill_tagged(self._containerd.service_id)
            self._containerd = None
        self._kill_shims()
        self._unmount_all()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)  # the logs stay, with the control plane's

    def _remove_containers(self) -> None:
        tasks = self.sink.ctr("tasks", "ls", "-q").stdout.split()
        for task in tasks:
            self.sink.ctr("tasks", "kill", "--signal", "SIGKILL", task)
        deadline = time.monotonic() + 10
        while tasks and time.monotonic() < deadline:
            for task in tasks:  # the CRI may have reaped it already: then it is not listed
                self.sink.ctr("tasks", "delete", task)
            tasks = self.sink.ctr("tasks", "ls", "-q").stdout.split()
            time.sleep(0.2 if tasks else 0)
        for container in self.sink.ctr("containers", "ls", "-q").stdout.split():
            self.sink.ctr("containers", "delete", container)
        self._remove_netns()

    def _remove_netns(self) -> None:
        """The CRI's network namespaces whose pods were on this node's bridge."""
        netns = Path("/var/run/netns")
        for ns in netns.glob("cni-*") if netns.is_dir() else []:
            links = subprocess.run(["ip", "-n", ns.name, "-o", "addr"], capture_output=True,
                                   text=True).stdout  # fmt: skip
            if self.subnet.rsplit(".", 1)[0] + "." in links:
                subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)

    def _kill_shims(self) -> None:
        """containerd's shims outlive it (they hold containers): kill those of this node."""
        needle = str(self.root / "containerd").encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), 9)

    def _unmount_all(self) -> None:
        root = str(self.root)
        mounts = [
            line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(root)
        ]  # fmt: skip
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
