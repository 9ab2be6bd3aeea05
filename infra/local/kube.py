"""A throwaway Kubernetes control plane on free loopback ports: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; kwok playing fake nodes, and real nodes
(:mod:`infra.local.kube_node`: the kubelet on containerd and runc) whose pods really run.

with LocalKube() as kube:
    kube.kubeconfig                  # a kubeconfig file for the admin user
    kube.api()                       # a kubernetes.client.ApiClient

Built from Go modules by ``scripts/setup k8s`` (:func:`infra.paths.k8s_dir`). Every start has its
own data directory, certificates (a CA, a separate front-proxy CA, a service-account key) and
ports; :meth:`stop` stops every process and removes what it created. On kwok's nodes no
container runs: kwok drives pod phases from :mod:`infra.local.kwok_stages` (pods are scheduled by
the real scheduler, owned objects are collected by the real controller-manager); it manages only
the nodes it was given (annotation ``kwok.x-k8s.io/node=fake``), never a real node. A
NetworkPolicy is stored and listed, not enforced (there is no policy agent).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra import paths
from infra.local.kube_dns import rbac_objects as dns_rbac
from infra.local.kube_node import NodeKubeconfigs, RealNode
from infra.local.kube_pki import REAL_NODE, make_pki
from infra.local.kwok_stages import stages_yaml
from infra.local.process import LocalService, ServiceProcess, free_port, tail
from schemas.errors import ServiceError

SERVICE_CIDR = "10.96.0.0/12"


class LocalKube(LocalService):
    """Start (``__enter__``) and stop (``__exit__``) a local control plane.

    Args:
        root: where data, certificates, logs and the kubeconfig go; a fresh temporary dir by
            default (removed on stop; a given one is kept).
        nodes: fake nodes kwok manages (``kwok-node-0`` ...), each with ``node_pods`` pod slots,
            ``node_cpus`` CPUs and ``node_memory_gi`` GiB.
        real_nodes: real kubelet nodes (0 or 1: ``openforge-node-0``; needs root), as
            :attr:`real_node`.
        apiserver_args: extra kube-apiserver flags (e.g. ``--watch-cache=false``).
        ready_timeout: seconds each component has to become ready.
    """

    description = "local Kubernetes control plane"

    def __init__(
        self,
        root: Path | None = None,
        nodes: int = 1,
        real_nodes: int = 0,
        node_pods: int = 1100,
        node_cpus: int = 32,
        node_memory_gi: int = 256,
        apiserver_args: Sequence[str] = (),
        ready_timeout: float = 60.0,
    ) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="openforge-kube-")) if root is None else root
        if real_nodes not in (0, 1):
            raise ValueError("real_nodes is 0 or 1 (one kubelet per machine)")
        self.nodes, self.real_nodes, self.node_pods = nodes, real_nodes, node_pods
        self.node_cpus, self.node_memory_gi = node_cpus, node_memory_gi
        self.apiserver_args = list(apiserver_args)
        self.ready_timeout = ready_timeout
        self.etcd_port, self.api_port = free_port(), free_port()
        self._processes: list[ServiceProcess] = []
        self.real_node: RealNode | None = None

    # -- where things are ------------------------------------------------------------------
    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    def api(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=cfg
        )
        cfg.connection_pool_maxsize = 32
        return client.ApiClient(cfg)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        k8s = paths.k8s_dir()
        bin_dir = k8s / "bin"
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        make_pki(self.pki)
        self._write_kubeconfig()
        try:
            self._start_all(bin_dir, k8s / "kwok-stages")
        except BaseException:
            self.stop()
            raise

    def kubeconfig_of(self, user: str) -> Path:
        """A kubeconfig for the certificate ``pki/USER.crt`` (``admin``: :attr:`kubeconfig`)."""
        return self.kubeconfig if user == "admin" else self.root / f"{user}.kubeconfig"

    def _write_kubeconfig(self) -> None:
        p = self.pki
        for user in ("admin", "node-0", "kube-proxy", "cluster-dns"):
            self.kubeconfig_of(user).write_text(
                "apiVersion: v1\nkind: Config\n"
                f"clusters:\n- name: local\n  cluster: {{server: '{self.server}', "
                f"certificate-authority: '{p / 'ca.crt'}'}}\n"
                f"users:\n- name: {user}\n  user: {{client-certificate: '{p / f'{user}.crt'}', "
                f"client-key: '{p / f'{user}.key'}'}}\n"
                f"contexts:\n- name: local\n  context: {{cluster: local, user: {user}}}\n"
                "current-context: local\n"
            )

    def _spawn(self, name: str, argv: list[str]) -> ServiceProcess:
        proc = ServiceProcess(name, argv, self.root / "logs" / f"{name}.log")
        proc.start()
        self._processes.append(proc)
        return proc

    def _start_all(self, bin_dir: Path, upstream_stages: Path) -> None:
        """etcd, then the API server, then the controllers and kwok; its nodes made ready."""
        self._start_etcd(bin_dir)
        self._start_apiserver(bin_dir)
        ready = self._start_controllers(bin_dir)
        self._start_kwok(bin_dir, upstream_stages)
        for wait in ready:
            wait()
        for n in range(self.nodes):
            self._create_node(f"kwok-node-{n}")
        if self.real_nodes:
            kubeconfigs = NodeKubeconfigs(
                kubelet=self.kubeconfig_of("node-0"),
                service_proxy=self.kubeconfig_of("kube-proxy"),
                policy_agent=self.kubeconfig,
                cluster_dns=self.kubeconfig_of("cluster-dns"),
            )
            for collection, obj in dns_rbac():
                self._request("POST", collection, obj)
            self.real_node = RealNode(
                self.root / "node-0", kubeconfigs, self.pki / "ca.crt", bin_dir, REAL_NODE
            )
            self.real_node.start()
        self._wait_nodes_ready()
        if self.real_node is not None:
            self.real_node.start_agents()

    def _start_etcd(self, bin_dir: Path) -> None:
        peer = free_port()
        etcd = self._spawn("etcd", [
            str(bin_dir / "etcd"), "--name=local", f"--data-dir={self.root / 'etcd'}",
            "--unsafe-no-fsync", f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=local=http://127.0.0.1:{peer}",
            "--listen-metrics-urls=", "--log-level=warn",
        ])  # fmt: skip
        etcd.wait_ready(lambda: self._get(f"{self.etcd_url}/health"), self.ready_timeout)

    def _start_apiserver(self, bin_dir: Path) -> None:
        p = self.pki
        api = self._spawn("kube-apiserver", [
            str(bin_dir / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--endpoint-reconciler-type=none", "--profiling=false",
            "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
            f"--requestheader-client-ca-file={p / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
            # a real node's kubelet (logs, exec): reached at its InternalIP with a client cert
            f"--kubelet-client-certificate={p / 'admin.crt'}",
            f"--kubelet-client-key={p / 'admin.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            *self.apiserver_args,
        ])  # fmt: skip
        api.wait_ready(lambda: self._get(f"{self.server}/readyz", tls=True), self.ready_timeout)

    def _start_controllers(self, bin_dir: Path) -> list[Callable[[], None]]:
        """The controller-manager and the scheduler, started; what waits for each to be ready."""
        p, run = self.pki, self.root
        common = [
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
            "--leader-elect=false", "--kube-api-qps=1000", "--kube-api-burst=1000",
        ]  # fmt: skip
        kcm_port, sched_port = free_port(), free_port()
        kcm = self._spawn("kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"), *common, f"--secure-port={kcm_port}",
            f"--root-ca-file={p / 'ca.crt'}", f"--service-account-private-key-file={p / 'sa.key'}",
            f"--flex-volume-plugin-dir={run / 'flexvolume'}", f"--cert-dir={run / 'kcm-certs'}",
            "--concurrent-gc-syncs=50",
        ])  # fmt: skip
        sched = self._spawn("kube-scheduler", [
            str(bin_dir / "kube-scheduler"), *common, f"--secure-port={sched_port}",
            f"--cert-dir={run / 'sched-certs'}",
        ])  # fmt: skip
        return [
            lambda: kcm.wait_ready(
                lambda: self._get(f"https://127.0.0.1:{kcm_port}/healthz", tls=False),
                self.ready_timeout,
            ),
            lambda: sched.wait_ready(
                lambda: self._get(f"https://127.0.0.1:{sched_port}/healthz", tls=False),
                self.ready_timeout,
            ),
        ]

    def _start_kwok(self, bin_dir: Path, upstream_stages: Path) -> None:
        p, run = self.pki, self.root
        (run / "kwok.yaml").write_text(stages_yaml(upstream_stages))
        kwok_port = free_port()
        self._spawn("kwok", [
            str(bin_dir / "kwok"), f"--kubeconfig={self.kubeconfig}",
            f"--config={run / 'kwok.yaml'}",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.244.0.0/16", "--node-ip=127.0.0.1",
            f"--node-port={kwok_port}", f"--server-address=127.0.0.1:{kwok_port}",
            "--node-lease-duration-seconds=40",
            f"--tls-cert-file={p / 'admin.crt'}", f"--tls-private-key-file={p / 'admin.key'}",
        ])  # fmt: skip

    def _ssl(self, tls: bool) -> ssl.SSLContext:
        if not tls:  # a component's own self-signed serving certificate
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _get(self, url: str, tls: bool | None = None) -> bool:
        ctx = None if tls is None else self._ssl(tls)
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(
            f"{self.server}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10, context=self._ssl(True)) as resp:
            return json.loads(resp.read())

    def _create_node(self, name: str) -> None:
        capacity = {"cpu": str(self.node_cpus), "memory": f"{self.node_memory_gi}Gi",
                    "pods": str(self.node_pods), "ephemeral-storage": "10Ti"}  # fmt: skip
        self._request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"type": "kwok", "kubernetes.io/hostname": name}},
            "status": {"capacity": capacity, "allocatable": capacity},
        })  # fmt: skip

    def _wait_nodes_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            items = self._request("GET", "/api/v1/nodes")["items"]
            ready = [
                n for n in items
                for c in n.get("status", {}).get("conditions") or []
                if c["type"] == "Ready" and c["status"] == "True"
            ]  # fmt: skip
            if len(ready) >= self.nodes + self.real_nodes:
                return
            time.sleep(0.2)
        logs = tail(self.root / "logs" / "kwok.log")
        if self.real_node is not None:
            logs += "\n" + self.real_node.log_tail()
        raise ServiceError(
            f"{self.nodes + self.real_nodes} node(s) were not ready in "
            f"{self.ready_timeout:.0f}s. Last lines of the logs:\n{logs}"
        )

    def restart(self, component: str, down_s: float = 0.0) -> None:
        """Stop one component (e.g. ``kube-apiserver``), wait ``down_s``, start it again and
        wait until it is ready: a fault for clients to survive."""
        proc = next((p for p in self._processes if p.name == component), None)
        if proc is None:
            raise ServiceError(
                f"no component {component!r} (have: {[p.name for p in self._processes]})"
            )
        proc.stop(grace=5.0)
        time.sleep(down_s)
        proc.start()
        if component == "kube-apiserver":
            proc.wait_ready(
                lambda: self._get(f"{self.server}/readyz", tls=True), self.ready_timeout
            )

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each component has used so far, from ``/proc``."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict[str, float] = {}
        for proc in self._processes:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[proc.name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def check_alive(self) -> None:
        if not self._processes:
            raise ServiceError("the local Kubernetes control plane is not running")
        for proc in self._processes:
            proc.check_alive()
        if self.real_node is not None:
            self.real_node.check_alive()

    def stop(self) -> None:
        if self.real_node is not None:  # first: its kubelet needs the API server to wind down
            self.real_node.stop()
            self.real_node = None
        for proc in reversed(self._processes):
            proc.stop(grace=5.0)
        self._processes.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- for tests of watch expiry ---------------------------------------------------------
    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (old watch resource versions then
        answer 410 Gone when the API server reads them from etcd); returns that revision."""
        req = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/range", data=json.dumps({"key": "AA=="}).encode()
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            revision = int(json.loads(resp.read())["header"]["revision"])
        req = urllib.request.Request(
            f"{self.etcd_url}/v3/kv/compaction",
            data=json.dumps({"revision": str(revision), "physical": True}).encode(),
        )
        with urllib.request.urlopen(req, timeout=30):
            pass
        return revision
