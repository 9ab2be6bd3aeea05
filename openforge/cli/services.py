"""``openforge services``: run the local services (Kafka broker, vLLM) until Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Protocol

import typer
from rich.console import Console

from openforge.cli.options import options_command


class KubeNodes(StrEnum):
    """``--kube-nodes``: the local cluster's nodes."""

    REAL = "real"  # one kubelet node on containerd and runc: pods really run (root)
    KWOK = "kwok"  # kwok's fake nodes: pods are scheduled, their phases played


app = typer.Typer(
    help="Local services: a Kafka broker, a vLLM server, a Kubernetes control plane.",
    no_args_is_help=True,
)


@dataclass(frozen=True)
class UpOptions:
    """``openforge services up``'s options: one field per option."""

    kafka: Annotated[bool, typer.Option(help="Start a Kafka broker.")] = True
    vllm: Annotated[bool, typer.Option(help="Start a vLLM server.")] = True
    kube: Annotated[
        bool,
        typer.Option(
            help="Start a local Kubernetes control plane (`scripts/setup k8s`) with a real node "
            "(the kubelet on containerd and runc; needs root) or kwok nodes."
        ),
    ] = False
    kube_nodes: Annotated[
        KubeNodes,
        typer.Option(
            help="With --kube: `real` (one kubelet node whose pods run; root) or `kwok` (fake "
            "nodes: pods are scheduled and their phases played, no container runs)."
        ),
    ] = KubeNodes.REAL
    registry: Annotated[
        bool,
        typer.Option(
            help="Start a local image registry (`scripts/setup k8s`) for `openforge tasks build "
            "--push` and `--kube-image-sink registry://...`."
        ),
    ] = False
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model", help="Model directory for vLLM (default: the tiny model).", resolve_path=True
        ),
    ] = None


@app.command("up")
@options_command(UpOptions)
def up(opts: UpOptions) -> None:
    """Start the services, print their addresses, and stop them cleanly on Ctrl-C."""
    console = Console(soft_wrap=True)  # a path is never broken across lines
    # SIGTERM stops us as cleanly as Ctrl-C does; SIGINT too where a shell started us in the
    # background (it ignores SIGINT there, and Python then keeps ignoring it).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    starts = [
        (opts.kafka, _kafka),
        (opts.vllm, _vllm),
        (opts.kube, _kube),
        (opts.registry, _registry),
    ]
    with contextlib.ExitStack() as stack:
        running = [start(stack, console, opts) for wanted, start in starts if wanted]
        console.print("running; press Ctrl-C to stop")
        try:
            while True:
                time.sleep(1.0)
                for service in running:
                    service.check_alive()
        except KeyboardInterrupt:
            console.print("stopping")


class _Alive(Protocol):
    def check_alive(self) -> None: ...


def _kafka(stack: contextlib.ExitStack, console: Console, opts: UpOptions) -> _Alive:
    from infra.local.kafka import KafkaBroker

    with console.status("starting Kafka broker"):
        broker = stack.enter_context(KafkaBroker())
    console.print(f"[green]kafka[/]  {broker.url}  (log: {broker.log_path})")
    return broker


def _vllm(stack: contextlib.ExitStack, console: Console, opts: UpOptions) -> _Alive:
    from infra.local.vllm import VLLMServer
    from infra.paths import default_tiny_dir
    from infra.tiny_model import build_tiny_model

    model = opts.model_dir or build_tiny_model(default_tiny_dir())
    with console.status(f"starting vLLM on {model}"):
        server = stack.enter_context(VLLMServer(model))
    console.print(
        f"[green]vllm[/]   {server.base_url}/v1  model={server.served_model_name}  "
        f"(log: {server.log_path})"
    )
    return server


def _kube(stack: contextlib.ExitStack, console: Console, opts: UpOptions) -> _Alive:
    from infra.local.kube import LocalKube

    real = opts.kube_nodes is KubeNodes.REAL
    with console.status("starting a local Kubernetes control plane"):
        cluster = stack.enter_context(LocalKube(nodes=0, real_nodes=1) if real else LocalKube())
    console.print(
        f"[green]kube[/]   {cluster.server}  export KUBECONFIG={cluster.kubeconfig}  "
        f"(logs: {cluster.root / 'logs'})",
        soft_wrap=True,
    )
    node = cluster.real_node
    if node is None:
        console.print("[green]node[/]   kwok-node-0 (kwok's: pods run no containers)")
        return cluster
    console.print(
        f"[green]node[/]   {node.name}: pods reach this machine at {node.gateway}; "
        f"task images: --kube-image-sink {node.sink.url}; NetworkPolicy enforced "
        f"(kube-router): --kube-egress-canary {node.policy.canary}",
        soft_wrap=True,
    )
    console.print(
        f"[green]dns[/]    pods reach Services by name (CoreDNS at {node.gateway}:53) "
        "and by cluster IP (kube-proxy)",
        soft_wrap=True,
    )
    return cluster


def _registry(stack: contextlib.ExitStack, console: Console, opts: UpOptions) -> _Alive:
    from infra.local.registry import LocalRegistry
    from infra.paths import runtime_dir

    with console.status("starting an image registry"):
        images = stack.enter_context(LocalRegistry(runtime_dir("registry")))
    console.print(
        f"[green]registry[/] {images.host}  openforge tasks build --push {images.host}  "
        f"--kube-image-sink registry://{images.host}  "
        f"(log: {images.root / 'registry.log'})",
        soft_wrap=True,
    )
    return images
