"""``openforge rollouts``: play a task set with a harness, each rollout sandboxed and verified."""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from infra.harnesses import HARNESSES
from orchestrator.backend import RolloutBackendName
from orchestrator.environments import SandboxMode
from schemas.registry import one_of

if TYPE_CHECKING:
    from rich.console import Console

    from infra.harnesses import Harness
    from infra.proxy_client import ProxyAdmin
    from infra.tasks import Task
    from orchestrator.backend import RolloutBackend, RunProxy
    from orchestrator.plan import PlannedRollout
    from orchestrator.registry import RolloutBackendConfig
    from orchestrator.run import Orchestrator, OrchestratorConfig
    from orchestrator.rundir import RolloutOutcome

app = typer.Typer(help="Run rollouts of Harbor tasks in sandboxes.", no_args_is_help=True)

# Context the tiny model needs for each harness's own prompts (17k-31k tokens for the npm CLIs).
LONG_CONTEXT = 65536
SHORT_CONTEXT = 4096


@app.command("run")
def run(
    tasks: Annotated[
        Path,
        typer.Option(
            help="A task directory, a directory of tasks, or a manifest.", resolve_path=True
        ),
    ],
    harness_name: Annotated[
        str,
        typer.Option(
            "--harness",
            help=f"The harness: {HARNESSES.listing()} (oracle runs the task's solution, noop "
            "does nothing).",
        ),
    ] = "oracle",
    n: Annotated[int, typer.Option("--n", help="Samples per task (one group per task).")] = 1,
    concurrency: Annotated[int, typer.Option(help="Rollouts running at once.")] = 4,
    backend: Annotated[
        str,
        typer.Option(
            help=f"Rollout backend: {one_of(RolloutBackendName)} (sandboxes on this machine, "
            "or pods)."
        ),
    ] = "local",
    out: Annotated[Path, typer.Option(help="The run directory.", resolve_path=True)] = Path(
        "runs/rollouts"
    ),
    split: Annotated[str | None, typer.Option(help="Only tasks of this split.")] = None,
    proxy: Annotated[
        str | None, typer.Option(help="A running proxy (default: start vLLM and a proxy).")
    ] = None,
    proxy_socket: Annotated[
        Path | None, typer.Option(help="That proxy's Unix socket (its --uds).", resolve_path=True)
    ] = None,
    admin_token: Annotated[
        str | None, typer.Option(envvar="OPENFORGE_ADMIN_TOKEN", help="That proxy's admin token.")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="Model directory for vLLM (default: the tiny model).", resolve_path=True),
    ] = None,
    max_attempts: Annotated[int, typer.Option(help="Attempts on infrastructure failure.")] = 3,
    allow_internet_tasks: Annotated[
        bool, typer.Option(help="Run allow_internet tasks anyway (the sandbox has no internet).")
    ] = False,
    sandbox: Annotated[
        str,
        typer.Option(
            help=f"(local backend) {one_of(SandboxMode)}. auto: a task with a Dockerfile "
            "runs in a container of its own image, others in bubblewrap; container; "
            "bubblewrap: every task on this machine's root filesystem."
        ),
    ] = "auto",
    strict_images: Annotated[
        bool,
        typer.Option(help="(local backend) refuse a FROM with no exact local image (no stand-in)."),
    ] = False,
    pull_images: Annotated[
        bool, typer.Option(help="(local backend) let buildah pull a FROM the local store lacks.")
    ] = False,
    max_workspace_mb: Annotated[
        float,
        typer.Option(
            help="save each final workspace (for `openforge replay rescore`) up to this size "
            "of files; a larger one is noted, not saved (kubernetes: its compressed archive "
            "also up to 6 MiB)."
        ),
    ] = 64.0,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBECONFIG",
            help="kubernetes: the cluster (default: in-cluster).",
            resolve_path=True,
        ),
    ] = None,
    kube_namespace: Annotated[
        str, typer.Option(help="kubernetes: the namespace rollout pods run in.")
    ] = "openforge-rollouts",
    kube_proxy_url: Annotated[
        str | None,
        typer.Option(help="kubernetes: the proxy as pods reach it (e.g. its Service URL)."),
    ] = None,
    harness_image: Annotated[
        str,
        typer.Option(
            help="kubernetes, without --kube-image-sink: the image holding the harnesses, in "
            "which tasks with no image of their own run (with a sink, they run in the "
            "catalogue's python:3.11-slim with the harness's install added)."
        ),
    ] = "ghcr.io/openforge/openforge:latest",
    kube_image_sink: Annotated[
        str | None,
        typer.Option(
            help="kubernetes: build each task's own image here and publish it to this sink for "
            "its pods (containerd:///PATH/containerd.sock: the local cluster's real node, as "
            "`openforge services up --kube` prints it). Default: pods run the Dockerfile's "
            "FROM image with the task's files laid out, and RUN lines are refused."
        ),
    ] = None,
    kube_egress_canary: Annotated[
        str | None,
        typer.Option(
            help="kubernetes: HOST:PORT no NetworkPolicy allows (`openforge services up --kube` "
            "prints the local node's); each pod waits until it is refused there, confined, "
            "before its first container's work."
        ),
    ] = None,
    kube_cpu_request: Annotated[
        float,
        typer.Option(
            help="kubernetes: the share of a task's cpus each pod requests (its limit stays "
            "the task's); below 1, rollouts share a node's cores."
        ),
    ] = 1.0,
) -> None:
    """Run every task N times with HARNESS: lay out, run in a sandbox, verify, record rewards."""
    from rich.console import Console

    from infra.harnesses import NpmHarness
    from infra.images import ImagePolicy
    from infra.proxy_client import ProxyAdmin
    from infra.sandbox import ProxyEndpoint
    from infra.tasks import load_dataset
    from openforge.cli.userns import enter_for_containers
    from openforge.stack import SANDBOX_PROXY_PORT, local_stack
    from orchestrator.backend import RolloutBackendName, RunProxy
    from orchestrator.environments import SandboxMode
    from orchestrator.kube_pod import PodSettings
    from orchestrator.kubernetes import KubeOptions
    from orchestrator.local import LocalConfig
    from orchestrator.registry import RolloutBackendConfig
    from orchestrator.run import OrchestratorConfig
    from schemas.registry import choose

    console = Console(soft_wrap=True)  # a path is never broken across lines
    chosen = _harnesses(harness_name)
    dataset = load_dataset(tasks, split=split)
    backend_name = choose(RolloutBackendName, backend, "rollout backend")  # before any start
    sandbox_mode = choose(SandboxMode, sandbox, "sandbox")
    if backend_name is RolloutBackendName.LOCAL:
        enter_for_containers(sandbox_mode)
    # SIGTERM unwinds like Ctrl-C: sandboxes, the proxy and vLLM are stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out.mkdir(parents=True, exist_ok=True)
    # Every backend's section from its own options; only the chosen one is read. The pods'
    # proxy URL is the run's own proxy unless --kube-proxy-url says otherwise.
    section = RolloutBackendConfig(
        name=backend_name,
        local=LocalConfig(
            allow_internet_tasks=allow_internet_tasks,
            max_workspace_bytes=int(max_workspace_mb * (1 << 20)),
            sandbox=sandbox_mode,
            images=ImagePolicy(strict=strict_images, pull=pull_images),
        ),
        kubernetes=KubeOptions(
            kubeconfig=kubeconfig,
            pod=PodSettings(
                namespace=kube_namespace,
                harness_image=harness_image,
                egress_canary=kube_egress_canary,
                cpu_request=kube_cpu_request,
            ),
            image_sink=kube_image_sink,
            images=ImagePolicy(strict=strict_images, pull=pull_images),
            max_workspace_bytes=int(max_workspace_mb * (1 << 20)),
        ),
    )
    job = _Job(console, chosen, dataset, n, out, backend, section, kube_proxy_url)
    settings = OrchestratorConfig(concurrency=concurrency, max_attempts=max_attempts)
    if proxy is not None:
        # Sandboxes reach it through its socket; pods over the network (--kube-proxy-url).
        socket = None if proxy_socket is None else ProxyEndpoint(proxy_socket, SANDBOX_PROXY_PORT)
        job.run_all(RunProxy(proxy, socket), ProxyAdmin(proxy, admin_token), settings, "tiny")
        return
    needs_model = any(h.capabilities.calls_model for h in chosen)
    long = any(isinstance(h, NpmHarness) for h in chosen)
    with local_stack(
        out / "services",
        needs_model=needs_model,
        context=LONG_CONTEXT if long else SHORT_CONTEXT,
        model_dir=model,
        say=console.print,
    ) as stack:
        run_proxy = RunProxy(stack.admin.url, stack.endpoint)
        job.run_all(run_proxy, stack.admin, settings, stack.model)


@dataclass(frozen=True)
class _Job:
    """What ``rollouts run`` plays: each harness in turn, every task ``n`` times, on one
    backend (``section``), one proxy and one model server."""

    console: Console
    chosen: list[Harness]
    dataset: list[Task]
    n: int
    out: Path
    backend: str
    section: RolloutBackendConfig
    kube_proxy_url: str | None

    def run_all(
        self, run_proxy: RunProxy, admin: ProxyAdmin, settings: OrchestratorConfig, model: str
    ) -> None:
        """Each harness's run, in its own directory under ``out`` when there are several.
        Exit 1 when any run failed."""
        from orchestrator.registry import build_backend

        rollout_backend = build_backend(self._section(run_proxy.url), run_proxy)
        settings = dataclasses.replace(settings, model=model)
        failed = []
        try:
            for each in self.chosen:
                if not self._run_one(each, rollout_backend, admin, settings):
                    failed.append(each.name)
        finally:
            rollout_backend.close()
        if failed:
            if len(self.chosen) > 1:
                self.console.print(f"[bold red]failed[/]: {', '.join(failed)} (above)")
            raise typer.Exit(1)

    def _section(self, proxy_url: str) -> RolloutBackendConfig:
        kube = self.section.kubernetes
        pod = dataclasses.replace(kube.pod, proxy_url=self.kube_proxy_url or proxy_url)
        return dataclasses.replace(self.section, kubernetes=dataclasses.replace(kube, pod=pod))

    def _run_one(
        self,
        each: Harness,
        rollout_backend: RolloutBackend,
        admin: ProxyAdmin,
        settings: OrchestratorConfig,
    ) -> bool:
        from orchestrator.plan import plan
        from orchestrator.run import Orchestrator
        from orchestrator.rundir import RunDir

        several = len(self.chosen) > 1
        run_dir = self.out / each.name if several else self.out
        orch = Orchestrator(rollout_backend, each, admin, RunDir(run_dir), settings)
        label = f"{each.name}: " if several else ""
        what = (
            f"{len(self.dataset)} tasks x {self.n} with {each.name} on the {self.backend} backend"
        )
        self.console.print(
            f"{label}{len(self.dataset) * self.n} rollouts: {what}; run directory {run_dir}"
        )
        return _play(self.console, orch, plan(self.dataset, self.n, run_id=run_dir.name), label)


def _harnesses(names: str) -> list[Harness]:
    """``--harness``: one name, or several joined by commas (each once)."""
    from infra.harnesses import harness
    from schemas.errors import ConfigError

    wanted = [name.strip() for name in names.split(",") if name.strip()]
    if not wanted or len(set(wanted)) != len(wanted):
        raise ConfigError(
            f"--harness {names!r}: give one harness, or several once each joined by commas, "
            "e.g. --harness codex,claude-code"
        )
    return [harness(name) for name in wanted]


def _play(console: Console, orch: Orchestrator, planned: list[PlannedRollout], label: str) -> bool:
    """Check each task, run the rollouts of those that can run, and print what happened;
    False when a task was refused, a rollout gave up, or none was verified."""
    from orchestrator.progress import live_progress, summary_table

    tasks = list({p.task.id: p.task for p in planned}.values())
    refused = _check_each(console, orch, tasks)  # images are built here, task by task
    runnable = [p for p in planned if p.task.id not in refused]
    if not runnable:
        console.print(f"[red]{label}no task can run[/]: {len(refused)} refused (above)")
        return False
    start = time.monotonic()
    try:
        with live_progress(console, orch.counts):
            outcomes = orch.run(runnable)
    except KeyboardInterrupt:
        console.print("[yellow]cancelled[/]: running sandboxes stopped")
        raise typer.Exit(130) from None
    console.print(summary_table(outcomes))
    counts, mean = orch.counts, orch.counts.mean_reward
    console.print(
        f"{label}{counts.done} verified, {counts.gave_up} gave up after infrastructure failures, "
        f"{counts.calls} calls recorded, mean reward {'-' if mean is None else f'{mean:.3f}'}, "
        f"{time.monotonic() - start:.1f} s; summary: {orch.run_dir.root / 'summary.csv'}"
    )
    _no_calls_note(console, orch.harness, outcomes)
    if refused:
        console.print(f"[red]{len(refused)} tasks refused[/]: {', '.join(sorted(refused))}")
    return _verified(console, orch.run_dir.root, outcomes) and not refused


def _check_each(console: Console, orch: Orchestrator, tasks: Sequence[Task]) -> dict[str, str]:
    """Check (and build the image of) each task before anything runs; a task that cannot run
    here is refused with its reason and the others go on. Returns the refused ids."""
    from schemas.errors import TaskError

    refused: dict[str, str] = {}
    for task in tasks:
        try:
            for note in orch.check([task]):
                console.print(f"[dim]note:[/] {note}")
        except TaskError as exc:
            refused[task.id] = str(exc)
            console.print(f"[red]refused[/] {task.id}: {exc}")
    return refused


def _no_calls_note(console: Console, chosen: Harness, outcomes: Sequence[RolloutOutcome]) -> None:
    """Say so when a harness that calls a model ended rollouts before its first call."""
    from orchestrator.rundir import Status

    silent = [o for o in outcomes if o.status is Status.VERIFIED and not o.calls]
    if chosen.capabilities.calls_model and silent:
        console.print(
            f"[yellow]note:[/] {len(silent)} rollouts made no call to the model "
            f"(e.g. {silent[0].rollout_id}: the harness ended before asking it; see its agent.err)"
        )


def _verified(console: Console, out: Path, outcomes: Sequence[RolloutOutcome]) -> bool:
    """False when a rollout gave up after infrastructure failures, or none was verified:
    then the first failure's message and where its files are are printed."""
    from orchestrator.rundir import Status

    failed = [o for o in outcomes if o.status is Status.INFRA_FAILED]
    if not failed and any(o.status is Status.VERIFIED for o in outcomes):
        return True
    if failed:
        first = failed[0]
        console.print(
            f"[bold red]first failure[/] ({first.rollout_id}, attempt {first.attempt}): "
            f"{first.message.strip()[:1500]}\n  its files: {out / 'rollouts' / first.rollout_id}"
        )
    else:
        console.print("[bold red]no rollout was verified[/]")
    return False
