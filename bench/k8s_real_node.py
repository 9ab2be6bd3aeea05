"""Rollouts on the local cluster's real node beside the container sandbox on this machine, in
one run: rollouts/min at the same concurrency, and a pod's creation to its agent's start.

    .venv/bin/python -m bench.k8s_real_node [--rollouts 24] [--concurrency 8] [--cpu-request 1 0.25]

Code paths, one after the other on the same trivial task (its image ``FROM
debian:bookworm-slim``, built once and published to the node's containerd before the clocks
start), each ``orchestrator.run.Orchestrator`` with the oracle and the real proxy in this
process:

- ``container``: ``orchestrator.local.LocalBackend`` in its default sandbox mode (a runc
  container of the task's image for the oracle, one for the verifier): bench.rollout_overhead's
  path;
- ``kubernetes``: ``orchestrator.kubernetes.KubernetesBackend`` on ``LocalKube(real_nodes=1)``:
  per rollout a Secret and a Pod whose init containers lay out the workspace (after the
  NetworkPolicy canary) and run the oracle, then the verifier container; the reward read from
  its termination message, the logs and the final workspace kept, the pod deleted; once per
  ``--cpu-request`` (the share of the task's one cpu each pod requests: 1 reserves it, so a
  2-core node admits two rollout pods at a time; 0.25 lets eight share the cores).

A watch of the rollout namespace records, per pod, when it was first seen (its creation) and
when its ``agent`` container was first seen started or ended: the latency to the harness's
first instruction, as the API server reports it. Proof of path: every Kubernetes rollout is
verified with reward 1, its pod was bound to ``openforge-node-0`` with the task's built image,
and its agent's log (``agent.out``) names the pod as its host and a pid namespace not this
process's; every container rollout passes bench.rollout_overhead's check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.rollout_overhead import _checked, _task
from infra.harnesses import Oracle
from infra.images import ImageBuilder
from infra.local.kube import LocalKube
from infra.paths import default_tiny_dir
from infra.sandbox import BubblewrapSandbox, ProxyEndpoint
from infra.tasks import load_task
from infra.tiny_model import build_tiny_model
from openforge.testing.proxy import proxy_config, running_proxy
from orchestrator.environments import SandboxMode
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.local import LocalBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status

NS = "openforge-rollouts"
SOLVE_K8S = "cat /etc/hostname; readlink /proc/self/ns/pid\n"


class PodClock:
    """Per pod: when the watch first saw it, and first saw its agent container started."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client, watch

        self.core, self.watch = client.CoreV1Api(api), watch.Watch()
        self.seen: dict[str, float] = {}
        self.agent: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.images: dict[str, set[str]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._follow()
        except Exception:  # the API server went away at the bench's end: nothing left to see
            return

    def _follow(self) -> None:
        for event in self.watch.stream(self.core.list_namespaced_pod, NS, timeout_seconds=0):
            pod, now = event["object"], time.monotonic()
            name = pod.metadata.name
            self.seen.setdefault(name, now)
            if pod.spec.node_name:
                self.nodes[name] = pod.spec.node_name
            self.images[name] = {c.image for c in pod.spec.init_containers or []}
            for cs in pod.status.init_container_statuses or []:
                if cs.name == "agent" and (cs.state.running or cs.state.terminated):
                    self.agent.setdefault(name, now)

    def stop(self) -> None:
        self.watch.stop()

    def latencies(self) -> list[float]:
        return [self.agent[n] - self.seen[n] for n in self.agent if n in self.seen]


def _k8s_checked(
    records: list[RolloutOutcome], n: int, run: Path, clock: PodClock, image: str
) -> list[float]:
    """Every rollout verified in its pod on the node, with the built image; returns its pods'
    creation -> agent start latencies."""
    ok = [r for r in records if r.status is Status.VERIFIED and r.reward == 1.0]
    assert len(ok) == n, [r.message for r in records if r not in ok][:3]
    host_pid_ns = Path("/proc/self/ns/pid").readlink().name
    for r in ok:
        host, pid_ns = (run / "rollouts" / r.rollout_id / "agent.out").read_text().split()[:2]
        assert host.startswith("ro-") and pid_ns != host_pid_ns, (r.rollout_id, host, pid_ns)
        assert clock.nodes.get(host) == "openforge-node-0", (host, clock.nodes.get(host))
        assert image in clock.images[host], clock.images[host]
        assert (run / "rollouts" / r.rollout_id / "final-workspace.tar.gz").exists()
    hosts = {(run / "rollouts" / r.rollout_id / "agent.out").read_text().split()[0] for r in ok}
    return [clock.agent[h] - clock.seen[h] for h in hosts if h in clock.agent and h in clock.seen]


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cpu-request", type=float, nargs="+", default=[1.0, 0.25])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-k8s-node-"))
    task_dir = _task(tmp / "task")
    (task_dir / "solution" / "solve.sh").write_text(
        (task_dir / "solution" / "solve.sh").read_text() + SOLVE_K8S
    )
    task = load_task(task_dir)
    model = build_tiny_model(default_tiny_dir(0), seed=0)
    config = proxy_config(
        "http://127.0.0.1:9", tmp / "proxy", tokenizer=model, upstream_model="tiny",
        max_model_len=4096,
    )  # fmt: skip
    rows: list[tuple[str, float, list[float]]] = []
    settings = OrchestratorConfig(concurrency=args.concurrency, max_attempts=1)
    host_ns = Path("/proc/self/ns/pid").readlink().name + Path("/proc/self/ns/net").readlink().name
    host_bins = len(os.listdir("/usr/bin"))
    with running_proxy(config, unix_socket=tmp / "proxy" / "proxy.sock") as proxy, LocalKube(
        tmp / "kube", nodes=0, real_nodes=1
    ) as kube:  # fmt: skip
        assert proxy.unix_socket is not None and kube.real_node is not None
        from kubernetes import client

        client.CoreV1Api(kube.api()).create_namespace({"metadata": {"name": NS}})
        local = LocalBackend(BubblewrapSandbox(), ProxyEndpoint(proxy.unix_socket, 8100),
                             sandbox_mode=SandboxMode.AUTO)  # fmt: skip
        node = kube.real_node
        paths: list[tuple[str, Any]] = [("container", local)]
        for share in args.cpu_request:
            pod = PodSettings(namespace=NS, egress_canary=node.policy.canary, cpu_request=share)
            options = KubeOptions(pod=pod, image_sink=node.sink.url, startup_grace_s=120.0)
            paths.append(
                (f"kubernetes, cpu_request {share:g}", KubernetesBackend(options, kube.api()))
            )
        clock = PodClock(kube.api())
        starts: dict[str, list[float]] = {}
        for i, (name, backend) in enumerate(paths):
            run = tmp / f"run-{i}"
            orch = Orchestrator(backend, Oracle(), proxy.admin, RunDir(run), settings)
            orch.check([task])  # the image built (or found), and published, before the clock
            t0 = time.perf_counter()
            records = orch.run(plan([task], args.rollouts, run_id=f"bench-{i}"))
            wall = time.perf_counter() - t0
            if backend is local:
                _checked(records, args.rollouts, run, host_ns, host_bins, SandboxMode.AUTO)
            else:
                image = ImageBuilder().image(task).ref  # cached: the one the sink published
                starts[name] = _k8s_checked(records, args.rollouts, run, clock, image)
                backend.close()
            rows.append((name, wall, [r.wall_s or 0.0 for r in records]))
        clock.stop()
    _report(args, rows, starts)


def _report(
    args: argparse.Namespace, rows: list[tuple[str, float, list[float]]],
    starts: dict[str, list[float]],
) -> None:  # fmt: skip
    print(
        f"{args.rollouts} rollouts of a trivial task at concurrency {args.concurrency}, "
        f"{os.cpu_count()} cores; every rollout checked for its path"
    )
    print("| path | rollouts/min | x container | rollout p50 s | p99 s | pod -> agent p50 s |")
    print("|---|---|---|---|---|---|")
    base = args.rollouts / rows[0][1] * 60
    for name, wall, walls in rows:
        rate = args.rollouts / wall * 60
        start = f"{_pct(starts[name], 0.5):.2f}" if starts.get(name) else "-"
        print(
            f"| {name} | {rate:,.1f} | {rate / base:.3f}x | {_pct(walls, 0.5):.2f} | "
            f"{_pct(walls, 0.99):.2f} | {start} |"
        )
    for name, values in starts.items():
        print(
            f"{name}: pod created -> agent container started (watch), {len(values)} pods: p50 "
            f"{_pct(values, 0.5):.2f} s, p90 {_pct(values, 0.9):.2f} s, mean "
            f"{statistics.mean(values):.2f} s"
        )


if __name__ == "__main__":
    main()
