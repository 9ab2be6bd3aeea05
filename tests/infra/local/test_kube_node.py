"""The local cluster's real node: the kubelet on containerd, runc and the CNI bridge runs a pod's
containers for real (their exit codes, logs read through the API server, this machine reached
at the node's gateway), survives a kubelet restart, and leaves nothing behind on stop."""

from __future__ import annotations

import contextlib
import http.server
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.images.sinks import ContainerdSink, image_sink
from infra.local.kube import LocalKube
from infra.local.kube_node import PAUSE_IMAGE
from infra.local.process import leftover_processes
from schemas.errors import ConfigError

IMAGE = "localhost/python:3.11-slim"


def _wait(what: str, probe: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def core(real_kube: LocalKube) -> Iterator[Any]:
    from kubernetes import client

    real_kube.real_node.load_image(IMAGE)  # type: ignore[union-attr]
    yield client.CoreV1Api(real_kube.api())


def _pod(name: str, script: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                }
            ],
        },
    }


def _finished(core: Any, name: str, timeout: float = 60.0) -> Any:
    return _wait(
        f"pod {name} to end",
        lambda: (
            (p := core.read_namespaced_pod(name, "default")).status.phase in ("Succeeded", "Failed")
            and p
        ),
        timeout,
    )


def test_a_pod_runs_for_real_its_exit_code_and_log_come_back(
    real_kube: LocalKube, core: Any
) -> None:
    (node,) = core.list_node().items
    assert node.metadata.name == "openforge-node-0"
    assert node.metadata.labels["openforge.dev/node"] == "real"
    core.create_namespaced_pod(
        "default", _pod("runs", "python3 -c 'import sys; print(sys.version_info[:2])'; exit 3")
    )
    pod = _finished(core, "runs")
    (status,) = pod.status.container_statuses
    assert pod.status.phase == "Failed" and status.state.terminated.exit_code == 3
    assert pod.status.pod_ip.startswith(real_kube.real_node.subnet.rsplit(".", 1)[0])  # type: ignore[union-attr]
    # the log, read through the API server from the kubelet
    assert core.read_namespaced_pod_log("runs", "default").strip() == "(3, 11)"
    core.delete_namespaced_pod("runs", "default", grace_period_seconds=0)


def test_a_pod_reaches_this_machine_at_the_node_gateway(real_kube: LocalKube, core: Any) -> None:
    node = real_kube.real_node
    assert node is not None
    token = uuid.uuid4().hex

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = token.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((node.gateway, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://{node.gateway}:{server.server_address[1]}/"
        fetch = f"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())"
        script = f'python3 -c "{fetch}"'
        core.create_namespaced_pod("default", _pod("reach", script))
        pod = _finished(core, "reach")
        assert pod.status.phase == "Succeeded", core.read_namespaced_pod_log("reach", "default")
        assert core.read_namespaced_pod_log("reach", "default").strip() == token
    finally:
        server.shutdown()
        core.delete_namespaced_pod("reach", "default", grace_period_seconds=0)


def test_a_pod_running_through_a_kubelet_restart_still_ends_and_is_seen(
    real_kube: LocalKube, core: Any
) -> None:
    node = real_kube.real_node
    assert node is not None
    core.create_namespaced_pod("default", _pod("through", "sleep 4; echo done"))
    _wait("the pod to run", lambda: core.read_namespaced_pod("through", "default").status.phase
          == "Running")  # fmt: skip
    node.restart_kubelet(down_s=1.0)
    pod = _finished(core, "through", timeout=90)
    assert pod.status.phase == "Succeeded"
    assert core.read_namespaced_pod_log("through", "default").strip() == "done"
    core.delete_namespaced_pod("through", "default", grace_period_seconds=0)


def test_the_containerd_sink_publishes_once_and_names_what_it_knows(real_kube: LocalKube) -> None:
    node = real_kube.real_node
    assert node is not None
    sink = image_sink(f"containerd://{node.socket}")
    assert isinstance(sink, ContainerdSink)
    assert sink.holds(PAUSE_IMAGE) and sink.holds(IMAGE)
    start = time.monotonic()
    assert sink.publish(IMAGE) == IMAGE  # already there: a lookup
    assert time.monotonic() - start < 5
    assert not sink.holds("localhost/openforge/task:not-built")
    with pytest.raises(ConfigError, match="containerd:///PATH"):
        image_sink("docker://somewhere")
    with pytest.raises(ConfigError, match="services up --kube"):
        image_sink("containerd:///nonexistent/containerd.sock")


def test_a_service_reaches_its_ready_pod_by_cluster_ip_from_here_and_by_name_from_a_pod(
    real_kube: LocalKube, core: Any
) -> None:
    """kube-proxy routes a Service's cluster IP to the pods behind it, from this machine; and a
    pod on the node reaches it by its name through the cluster DNS (CoreDNS, the kubelet's
    ``clusterDNS``): fully qualified, and short through the pod's search path."""
    ip = "10.96.200.20"
    server = _pod("web", "mkdir -p /tmp/w && echo served > /tmp/w/index.html && "
                  "cd /tmp/w && exec python3 -m http.server 8080")  # fmt: skip
    server["metadata"]["labels"] = {"app": "web"}
    server["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1
    }  # fmt: skip
    service = {
        "metadata": {"name": "web"},
        "spec": {
            "clusterIP": ip, "selector": {"app": "web"},
            "ports": [{"port": 80, "targetPort": 8080}],
        },
    }  # fmt: skip
    core.create_namespaced_service("default", service)
    core.create_namespaced_pod("default", server)
    try:

        def ready() -> bool:
            status = core.read_namespaced_pod("web", "default").status
            return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])

        _wait("the web pod to be ready", ready)
        url = f"http://{ip}/index.html"
        body = _wait("the cluster IP to answer here", lambda: _get(url))
        assert body.strip() == "served"
        client_pod = _pod("client", f"python3 -c '{_RESOLVE_AND_FETCH}'")
        core.create_namespaced_pod("default", client_pod)
        pod = _finished(core, "client")
        log = core.read_namespaced_pod_log("client", "default")
        assert pod.status.phase == "Succeeded", log
        assert log.split() == [
            f"web.default.svc.cluster.local={ip}",
            f"web={ip}",
            "kubernetes.default.svc.cluster.local=10.96.0.1",
            "served",
            "served",
        ], log
    finally:
        for name in ("web", "client"):
            with contextlib.suppress(Exception):
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        core.delete_namespaced_service("web", "default")


_RESOLVE_AND_FETCH = """
import socket, urllib.request
for name in ("web.default.svc.cluster.local", "web", "kubernetes.default.svc.cluster.local"):
    print(name + "=" + socket.gethostbyname(name))
for url in ("http://web.default.svc.cluster.local/index.html", "http://web/index.html"):
    print(urllib.request.urlopen(url, timeout=10).read().decode().strip())
"""


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def test_the_node_s_programs_are_themselves_to_the_api_server(real_kube: LocalKube) -> None:
    """The kubelet holds a node's credential (the Node authorizer and NodeRestriction bound it to
    its own node and its own pods' objects), kube-proxy and CoreDNS their own (they read
    Services, no more)."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    def forbidden(call: Any) -> bool:
        try:
            call()
        except ApiException as exc:
            return exc.status == 403
        return False

    node = client.CoreV1Api(config.new_client_from_config(str(real_kube.kubeconfig_of("node-0"))))
    assert node.read_node("openforge-node-0").metadata.name == "openforge-node-0"
    assert forbidden(lambda: node.list_secret_for_all_namespaces())
    assert forbidden(lambda: node.create_namespaced_pod("default", _pod("as-node", "true")))
    assert forbidden(lambda: node.delete_namespaced_service("kubernetes", "default"))
    proxy = client.CoreV1Api(
        config.new_client_from_config(str(real_kube.kubeconfig_of("kube-proxy")))
    )
    assert proxy.list_service_for_all_namespaces().items  # what it routes
    assert forbidden(lambda: proxy.list_secret_for_all_namespaces())
    assert forbidden(lambda: proxy.create_namespaced_pod("default", _pod("as-proxy", "true")))
    dns = client.CoreV1Api(
        config.new_client_from_config(str(real_kube.kubeconfig_of("cluster-dns")))
    )
    assert dns.list_service_for_all_namespaces().items  # what it resolves
    assert forbidden(lambda: dns.list_secret_for_all_namespaces())
    assert forbidden(lambda: dns.list_pod_for_all_namespaces())
    assert forbidden(lambda: dns.delete_namespaced_service("kubernetes", "default"))


def test_stop_leaves_no_process_mount_link_or_namespace(tmp_path: Path) -> None:
    before = set(leftover_processes())
    others = set(Path("/var/run/netns").glob("cni-*"))  # other clusters' pods (the session's)
    with LocalKube(tmp_path / "kube", nodes=0, real_nodes=1) as kube:
        node = kube.real_node
        assert node is not None
        bridge, root, node_ip = node.bridge, node.root, f"{node.gateway}/32"
        from kubernetes import client

        core: Any = client.CoreV1Api(kube.api())
        # the sandbox image's program runs until stopped (no image to load: every node has it)
        pod = _pod("left", "")
        container = pod["spec"]["containers"][0]
        container["image"] = PAUSE_IMAGE
        del container["command"]
        core.create_namespaced_pod("default", pod)
        _wait("the pod to run", lambda: core.read_namespaced_pod("left", "default").status.phase
              == "Running")  # fmt: skip
        netns = set(Path("/var/run/netns").glob("cni-*")) - others
        assert netns
        _wait("kube-proxy's rules", lambda: node_ip in _iptables())
    assert set(leftover_processes()) - before == set()
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
    assert not any(p.exists() for p in netns)
    assert not root.exists()
    rules = _iptables()
    assert "KUBE-ROUTER" not in rules and "KUBE-POD-FW" not in rules  # the policy agent's
    # kube-proxy's name the node's IP (its node ports); the module's cluster, alive beside this
    # one, has a kube-proxy of its own, which restores its own rules at its next sync
    assert [line for line in rules.splitlines() if node_ip in line] == []
    assert (tmp_path / "kube" / "node-0" / "logs" / "kubelet.log").exists()  # logs are kept
    stray = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout
    assert stray == ""


def _iptables() -> str:
    return subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
