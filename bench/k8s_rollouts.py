"""Control-plane cost of the Kubernetes rollout backend: N rollouts launched, watched to their
verified end and cleaned up, on a local API server with kwok nodes.

    python -m bench.k8s_rollouts --rollouts 1000 --concurrency 1000

Path measured: :meth:`orchestrator.kubernetes.KubernetesBackend.run` per rollout (its Secret and
Pod created, the pod followed through the backend's one watch, the agent's and the verifier's
termination messages read; its Pod and Secret deleted with other verified rollouts' in one call
per kind, :mod:`orchestrator.kube_reaper`, or each at once with ``--baseline``'s first run),
then :meth:`close` (the run's anchor
deleted; garbage collection takes its ConfigMaps) until nothing of the run is left. kwok plays
the nodes: pods carry the annotations its stages answer with the agent's exit and the
verifier's reward at once (:mod:`infra.local.kwok_stages`), so no image is pulled and no
container runs: this is control-plane cost only (scheduling, status updates, watch delivery,
deletes). The proof it took the path: every rollout's reward (0.5) comes back parsed from its
verifier's termination message, the pods created equal the rollouts, and the watch counters.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import apiserver_profile
from infra.harnesses import NoOp
from infra.local.kube import LocalKube
from infra.local.kwok_stages import AGENT_MESSAGE, VERIFIER_MESSAGE
from infra.tasks import load_task
from orchestrator.backend import AgentEnd, RolloutJob
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "echo-words" / "echo-about"
NS = "openforge-rollouts"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _left(core: Any, label: str) -> int:
    sel = f"openforge.dev/run={label}"
    return sum(
        len(fn(NS, label_selector=sel).items)
        for fn in (core.list_namespaced_pod, core.list_namespaced_secret,
                   core.list_namespaced_config_map)
    )  # fmt: skip


def run(
    rollouts: int, concurrency: int, tmp: Path, delete_batch: int = 64, profile_s: int = 0
) -> dict[str, Any]:
    """One launch on a fresh control plane; with ``profile_s``, the API server's CPU profile of
    the launch's first ``profile_s`` seconds, summarized (:mod:`bench.apiserver_profile`)."""
    from kubernetes import client

    task = load_task(TASK)
    harness = NoOp()
    # Ten nodes of 110 pods (Kubernetes' default per node), room for every pod at once.
    with LocalKube(
        tmp / "kube", nodes=10, node_pods=110, node_cpus=128, node_memory_gi=512,
        apiserver_args=apiserver_profile.FLAGS if profile_s else (),
    ) as kube:  # fmt: skip
        api = kube.api()
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NS}})
        annotations = {
            AGENT_MESSAGE: json.dumps({"exit_code": 0}),
            VERIFIER_MESSAGE: '{"exit_code": 0, "file": "reward.txt"}\n0.5\n',
        }
        options = KubeOptions(
            kubeconfig=kube.kubeconfig,
            delete_batch=delete_batch,
            pod=PodSettings(namespace=NS, proxy_url="http://openforge-proxy:8000",
                            harness_image="openforge:bench", annotations=annotations),
        )  # fmt: skip
        backend = KubernetesBackend(options, api=kube.api())
        ended: list[AgentEnd] = []
        lock = threading.Lock()

        def one(n: int) -> tuple[float, float]:
            job = RolloutJob(f"bench-{n}", task, harness, f"key-{n}", "tiny", tmp / "r" / str(n))
            t0 = time.monotonic()
            verified = backend.run(job, lambda a: ended.append(a))
            with lock:
                assert verified.reward.reward == 0.5, verified
            return t0, time.monotonic()

        backend.prepare()  # the run's set-up (anchor, NetworkPolicy, watch) before the clock
        cpu0, own0 = kube.cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF)
        start = time.monotonic()
        kept = Path("runs") / "bench-k8s" / f"apiserver-batch{delete_batch}.pprof"
        profiling = apiserver_profile.start(kube, profile_s, kept) if profile_s else None
        with ThreadPoolExecutor(concurrency) as pool:
            spans = list(pool.map(one, range(rollouts)))
        verified_at = time.monotonic()
        label = backend.labels["openforge.dev/run"]
        backend.close()
        while _left(core, label):
            time.sleep(0.2)
        wall = time.monotonic() - start
        cpu1, own1 = kube.cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF)
        cpu = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        cpu["orchestrator (this process)"] = (
            own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
        )
        stats = backend.watch_stats
        per = [end - begin for begin, end in spans]
        profile: dict[str, Any] = {}
        if profiling is not None:
            profiling.join()
            profile = {
                "apiserver_profile": {
                    "file": str(kept),
                    "seconds": profile_s,
                    **apiserver_profile.summarize(kept),
                }
            }
        return {
            "delete_batch": delete_batch,
            "rollouts": rollouts,
            "concurrency": concurrency,
            "verified": len(ended),
            "wall_s": round(wall, 2),
            "to_last_verified_s": round(verified_at - start, 2),
            "pods_per_s": round(rollouts / wall, 1),
            "rollout_s_p50": round(statistics.median(per), 3),
            "rollout_s_p99": round(_pct(per, 0.99), 3),
            "watch_lag_ms_p50": round(1000 * _pct(backend.watch_lags, 0.5), 1),
            "watch_lag_ms_p99": round(1000 * _pct(backend.watch_lags, 0.99), 1),
            "api_calls_per_rollout": round(backend.api_calls / rollouts, 2),
            "api_writes_per_rollout": round(backend.api_writes / rollouts, 2),
            "watch": vars(stats),
            "cpu_ms_per_rollout": {k: round(1000 * v / rollouts, 1) for k, v in cpu.items()},
            "cpu_s_total": round(sum(cpu.values()), 1),
            **profile,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument(
        "--baseline", action="store_true",
        help="first the same launch with each rollout's Pod and Secret deleted at once "
        "(delete_batch 1), each on a fresh control plane, and their ratios",
    )  # fmt: skip
    parser.add_argument(
        "--apiserver-profile", type=int, default=0, metavar="SECONDS",
        help="a CPU profile of the API server over the launch's first SECONDS, attributed to "
        "request kinds and mechanisms (bench/apiserver_profile.py; needs the go command); "
        "kept in runs/bench-k8s/ for `go tool pprof`",
    )  # fmt: skip
    args = parser.parse_args()
    results = []
    for batch in [1, 64] if args.baseline else [64]:
        with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
            results.append(
                run(args.rollouts, args.concurrency, Path(tmp), batch, args.apiserver_profile)
            )
        print(json.dumps(results[-1], indent=2), flush=True)
    if len(results) == 2:
        base, new = results
        ratios = {
            "wall": new["wall_s"] / base["wall_s"],
            "api_writes": new["api_writes_per_rollout"] / base["api_writes_per_rollout"],
            "apiserver_cpu": new["cpu_ms_per_rollout"]["kube-apiserver"]
            / base["cpu_ms_per_rollout"]["kube-apiserver"],
            "cpu_total": new["cpu_s_total"] / base["cpu_s_total"],
        }
        print(json.dumps({"batched / one at a time": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
