"""Each harness in a pod on the local cluster's real node: its install added to a task's image as
one layer, then one rollout, through the proxy, on the tiny model (64k context).

    .venv/bin/python -m bench.k8s_harnesses [--harness agent,codex,claude-code,openclaw]

Code path, per harness: ``orchestrator.kubernetes.KubernetesBackend`` with the node's containerd
as image sink, driven by ``orchestrator.run.Orchestrator``: ``check`` builds the task's image
(``examples/images/package-count``: ``FROM debian:bookworm-slim``, no Node, no Python, no
``libssl``), adds the harness's install and the system libraries it lacks
(``infra.images.layers.add_files``) and imports the result into the node's containerd; ``run``
plays one rollout as a pod (workspace, agent, verifier containers; the rollout NetworkPolicy
enforced, the pod waiting on the egress canary). Figures: the layer (size, build + import
seconds) and the rollout (wall seconds, calls the proxy recorded). Proof of path: the pod ran on
``openforge-node-0`` (the kubelet's log names it), the verifier scored it from its container
(verified), the proxy recorded at least one call of the rollout (the harness reached the model
from the pod, through the only address the policy allows), and the final workspace came back.
The tiny model answers noise, so a harness may end failed (Codex stops at the token cap): the
bench measures that the harness runs in its pod, not that it solves the task.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from infra.harnesses import harness
from infra.images import ImageBuilder
from infra.local.kube import LocalKube
from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.tasks import load_task
from infra.tiny_model import TinyModelSpec, build_tiny_model
from openforge.testing.proxy import proxy_config, running_proxy
from orchestrator.kube_objects import dns_name
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir, Status

NS = "openforge-rollouts"
CONTEXT = 65536  # the npm harnesses' own prompts are 17k-31k tokens
TASK = Path(__file__).resolve().parents[1] / "examples" / "images" / "package-count"


def _image_size(ref: str) -> str:
    """The image's size (all its layers), as buildah reports it (e.g. ``670 MB``)."""
    done = ImageBuilder().store.run("images", "--json", ref)
    (image,) = json.loads(done.stdout)
    return str(image["size"])


def _checked(record: RolloutOutcome, run: Path, kube: LocalKube) -> dict[str, object]:
    assert record.status is Status.VERIFIED, record.message
    assert (record.calls or 0) >= 1, "the harness made no call through the proxy from its pod"
    rollout = run / "rollouts" / record.rollout_id
    assert json.loads((rollout / "final-workspace.json").read_text())["saved"] is True
    kubelet = (kube.root / "node-0" / "logs" / "kubelet.log").read_text()
    pod = dns_name("ro", record.rollout_id)
    assert pod in kubelet, f"the kubelet never ran {pod}"
    return {"calls": record.calls, "agent": record.message or "exit code 0"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", default="agent,codex,claude-code,openclaw")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="openforge-bench-k8s-harnesses-"))
    spec = TinyModelSpec(max_position_embeddings=CONTEXT)
    model = build_tiny_model(default_tiny_dir(0, CONTEXT), seed=0, spec=spec)
    task = load_task(TASK)
    rows = []
    with LocalKube(tmp / "kube", nodes=0, real_nodes=1) as kube, VLLMServer(
        model, served_model_name="tiny", max_model_len=CONTEXT, enable_lora=False
    ) as vllm:  # fmt: skip
        node = kube.real_node
        assert node is not None
        subprocess.run(["kubectl", "--kubeconfig", str(kube.kubeconfig), "create", "namespace",
                        NS], check=True, capture_output=True)  # fmt: skip
        config = proxy_config(vllm.base_url, tmp / "proxy", tokenizer=model, max_tokens_cap=48)
        with running_proxy(config, host=node.gateway) as proxy:
            port = urlsplit(proxy.url).port
            assert port is not None
            for name in args.harness.split(","):
                pod = PodSettings(namespace=NS, proxy_url=proxy.url,
                                  egress_canary=node.policy.canary)  # fmt: skip
                backend = KubernetesBackend(KubeOptions(
                    kubeconfig=kube.kubeconfig, pod=pod, proxy_port=port,
                    proxy_cidr=f"{node.gateway}/32", image_sink=node.sink.url,
                    startup_grace_s=300,
                ))  # fmt: skip
                run = tmp / f"run-{name}"
                orch = Orchestrator(backend, harness(name), proxy.admin, RunDir(run),
                                    OrchestratorConfig(concurrency=1, max_attempts=1))  # fmt: skip
                try:
                    t0 = time.perf_counter()
                    (line,) = orch.check([task])
                    layer_s = time.perf_counter() - t0
                    ref = re.search(r"image (\S+) \(built", line)[1]  # type: ignore[index]
                    t0 = time.perf_counter()
                    (record,) = orch.run(plan([task], 1, backend.run_id))
                    wall = time.perf_counter() - t0
                finally:
                    backend.close()
                rows.append((name, _image_size(ref), layer_s, wall, _checked(record, run, kube)))
    head = "| harness | image with its layer | layer built + imported s | rollout s | calls"
    print(head + " | agent |")
    print("|---|---|---|---|---|---|")
    for name, size, layer_s, wall, seen in rows:
        print(f"| {name} | {size} | {layer_s:.1f} | {wall:.1f} | {seen['calls']} | "
              f"{seen['agent']} |")  # fmt: skip


if __name__ == "__main__":
    main()
