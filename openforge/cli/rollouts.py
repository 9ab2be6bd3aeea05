"""``openforge rollouts``: play a task set with a harness, each rollout sandboxed and verified."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from infra.harnesses import HARNESSES
from openforge.cli.options import options_command
from openforge.cli.proxy import FAULT_SEED, FAULTS
from orchestrator.backend import RolloutBackendName
from orchestrator.environments import SandboxMode
from schemas.errors import ConfigError
from schemas.faults import FaultPlan
from schemas.registry import one_of

if TYPE_CHECKING:
    from rich.console import Console

    from infra.harnesses import Harness
    from infra.proxy_client import ProxyAdmin
    from infra.tasks import Task
    from orchestrator.backend import RolloutBackend, RunProxy
    from orchestrator.registry import RolloutBackendConfig
    from orchestrator.run import OrchestratorConfig

app = typer.Typer(help="Run rollouts of Harbor tasks in sandboxes.", no_args_is_help=True)

# Context the tiny model needs for each harness's own prompts (17k-31k tokens for the npm CLIs).
LONG_CONTEXT = 65536
SHORT_CONTEXT = 4096


@dataclass(frozen=True)
class RunOptions:
    """``openforge rollouts run``'s options: one field per option."""

    tasks: Annotated[
        Path,
        typer.Option(
            help="A task directory, a directory of tasks, or a manifest.", resolve_path=True
        ),
    ]
    harness_name: Annotated[
        str,
        typer.Option(
            "--harness",
            help=f"The harness: {HARNESSES.listing()} (oracle runs the task's solution, noop "
            "does nothing).",
        ),
    ] = "oracle"
    n: Annotated[int, typer.Option("--n", help="Samples per task (one group per task).")] = 1
    concurrency: Annotated[int, typer.Option(help="Rollouts running at once.")] = 4
    backend: Annotated[
        str,
        typer.Option(
            help=f"Rollout backend: {one_of(RolloutBackendName)} (sandboxes on this machine, "
            "or pods)."
        ),
    ] = "local"
    out: Annotated[Path, typer.Option(help="The run directory.", resolve_path=True)] = Path(
        "runs/rollouts"
    )
    split: Annotated[str | None, typer.Option(help="Only tasks of this split.")] = None
    proxy: Annotated[
        str | None, typer.Option(help="A running proxy (default: start vLLM and a proxy).")
    ] = None
    proxy_socket: Annotated[
        Path | None, typer.Option(help="That proxy's Unix socket (its --uds).", resolve_path=True)
    ] = None
    admin_token: Annotated[
        str | None, typer.Option(envvar="OPENFORGE_ADMIN_TOKEN", help="That proxy's admin token.")
    ] = None
    model: Annotated[
        Path | None,
        typer.Option(help="Model directory for vLLM (default: the tiny model).", resolve_path=True),
    ] = None
    max_attempts: Annotated[int, typer.Option(help="Attempts on infrastructure failure.")] = 3
    allow_internet_tasks: Annotated[
        bool, typer.Option(help="Run allow_internet tasks anyway (the sandbox has no internet).")
    ] = False
    sandbox: Annotated[
        str,
        typer.Option(
            help=f"(local backend) {one_of(SandboxMode)}. auto: a task with a Dockerfile "
            "runs in a container of its own image, others in bubblewrap; container; "
            "bubblewrap: every task on this machine's root filesystem."
        ),
    ] = "auto"
    strict_images: Annotated[
        bool,
        typer.Option(help="(local backend) refuse a FROM with no exact local image (no stand-in)."),
    ] = False
    pull_images: Annotated[
        bool, typer.Option(help="(local backend) let buildah pull a FROM the local store lacks.")
    ] = False
    max_workspace_mb: Annotated[
        float,
        typer.Option(
            help="save each final workspace (for `openforge replay rescore`) up to this size "
            "of files; a larger one is noted, not saved (kubernetes: its compressed archive "
            "also up to 6 MiB)."
        ),
    ] = 64.0
    warm_pool: Annotated[
        bool,
        typer.Option(
            help="(local backend) start agent sandboxes ahead, one per --concurrency slot, the "
            "harness's runtime preloaded (the built-in agent); a rollout that finds none ready "
            "runs cold."
        ),
    ] = False
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBECONFIG",
            help="kubernetes: the cluster (default: in-cluster).",
            resolve_path=True,
        ),
    ] = None
    kube_namespace: Annotated[
        str, typer.Option(help="kubernetes: the namespace rollout pods run in.")
    ] = "openforge-rollouts"
    kube_proxy_url: Annotated[
        str | None,
        typer.Option(help="kubernetes: the proxy as pods reach it (e.g. its Service URL)."),
    ] = None
    harness_image: Annotated[
        str,
        typer.Option(
            help="kubernetes, without --kube-image-sink: the image holding the harnesses, in "
            "which tasks with no image of their own run (with a sink, they run in the "
            "catalogue's python:3.11-slim with the harness's install added)."
        ),
    ] = "ghcr.io/openforge/openforge:latest"
    kube_image_sink: Annotated[
        str | None,
        typer.Option(
            help="kubernetes: build each task's own image here and publish it to this sink for "
            "its pods (containerd:///PATH/containerd.sock: the local cluster's real node, as "
            "`openforge services up --kube` prints it). Default: pods run the Dockerfile's "
            "FROM image with the task's files laid out, and RUN lines are refused."
        ),
    ] = None
    kube_egress_canary: Annotated[
        str | None,
        typer.Option(
            help="kubernetes: HOST:PORT no NetworkPolicy allows (`openforge services up --kube` "
            "prints the local node's); each pod waits until it is refused there, confined, "
            "before its first container's work."
        ),
    ] = None
    kube_cpu_request: Annotated[
        float,
        typer.Option(
            help="kubernetes: the share of a task's cpus each pod requests (its limit stays "
            "the task's); below 1, rollouts share a node's cores."
        ),
    ] = 1.0
    agent_timeout_multiplier: Annotated[
        float,
        typer.Option(
            help="every task's agent deadline times this (Harbor's --agent-timeout-multiplier; "
            "the verifier's are the task's own).",
            min=0.01,
        ),
    ] = 1.0
    fault: FAULTS = None  # injected by the run's own proxy (refused with --proxy)
    fault_seed: FAULT_SEED = 0


@app.command("run")
@options_command(RunOptions)
def run(opts: RunOptions) -> None:
    """Run every task N times with HARNESS: lay out, run in a sandbox, verify, record rewards."""
    from rich.console import Console

    from infra.harnesses import NpmHarness
    from infra.proxy_client import ProxyAdmin
    from infra.sandbox import ProxyEndpoint
    from infra.tasks import load_dataset
    from openforge.cli.userns import enter_for_containers
    from openforge.stack import SANDBOX_PROXY_PORT, local_stack
    from orchestrator.backend import RolloutBackendName, RunProxy
    from orchestrator.environments import SandboxMode
    from orchestrator.registry import ROLLOUT_BACKENDS
    from orchestrator.run import OrchestratorConfig
    from schemas.registry import choose

    console = Console(soft_wrap=True)  # a path is never broken across lines
    chosen = _harnesses(opts.harness_name)
    dataset = load_dataset(opts.tasks, split=opts.split)
    if opts.agent_timeout_multiplier != 1:
        dataset = [t.with_agent_timeout_multiplier(opts.agent_timeout_multiplier) for t in dataset]
    backend_name = choose(RolloutBackendName, opts.backend, "rollout backend")  # before any start
    faults = FaultPlan.parse(opts.fault, opts.fault_seed) if opts.fault else None
    ROLLOUT_BACKENDS.get(backend_name).check_faults(faults)
    sandbox_mode = choose(SandboxMode, opts.sandbox, "sandbox")
    if backend_name is RolloutBackendName.LOCAL:
        enter_for_containers(sandbox_mode)
    # SIGTERM unwinds like Ctrl-C: sandboxes, the proxy and vLLM are stopped, not orphaned.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    opts.out.mkdir(parents=True, exist_ok=True)
    section = _section(opts, backend_name, sandbox_mode)
    job = _Job(
        console, chosen, dataset, opts.n, opts.out, opts.backend, section, opts.kube_proxy_url
    )
    settings = OrchestratorConfig(
        concurrency=opts.concurrency, max_attempts=opts.max_attempts, faults=faults
    )
    if opts.proxy is not None:
        if faults is not None and faults.active:
            raise ConfigError(
                "--fault is injected by the run's own proxy: leave out --proxy, or start your "
                "proxy with `openforge proxy --fault KIND=RATE`"
            )
        # Sandboxes reach it through its socket; pods over the network (--kube-proxy-url).
        socket = (
            None
            if opts.proxy_socket is None
            else ProxyEndpoint(opts.proxy_socket, SANDBOX_PROXY_PORT)
        )
        job.run_all(
            RunProxy(opts.proxy, socket), ProxyAdmin(opts.proxy, opts.admin_token), settings, "tiny"
        )
        return
    needs_model = any(h.capabilities.calls_model for h in chosen)
    long = any(isinstance(h, NpmHarness) for h in chosen)
    with local_stack(
        opts.out / "services",
        needs_model=needs_model,
        context=LONG_CONTEXT if long else SHORT_CONTEXT,
        model_dir=opts.model,
        say=console.print,
        faults=faults,
    ) as stack:
        run_proxy = RunProxy(stack.admin.url, stack.endpoint)
        try:
            job.run_all(run_proxy, stack.admin, settings, stack.model)
        finally:
            _archive(console, stack.log_url, opts.out)


def _archive(console: Console, log_url: str, out: Path) -> None:
    """The run's events, archived where ``openforge audit`` and ``query --run`` read them."""
    from openforge.query.log_archive import archive_log

    written, damaged = archive_log(log_url, out / "archive")
    note = f" ({damaged} damaged frames left out: the log keeps them)" if damaged else ""
    console.print(
        f"{written} events archived in {out / 'archive'}{note}: openforge audit {out}; "
        f"openforge query --run {out}"
    )


def _section(
    opts: RunOptions, backend_name: RolloutBackendName, sandbox_mode: SandboxMode
) -> RolloutBackendConfig:
    """Every backend's section from its own options; only the chosen one is read. The pods'
    proxy URL is the run's own proxy unless --kube-proxy-url says otherwise (``_Job``)."""
    from infra.images import ImagePolicy
    from orchestrator.kube_pod import PodSettings
    from orchestrator.kubernetes import KubeOptions
    from orchestrator.local import LocalConfig
    from orchestrator.registry import RolloutBackendConfig

    images = ImagePolicy(strict=opts.strict_images, pull=opts.pull_images)
    workspace_bytes = int(opts.max_workspace_mb * (1 << 20))
    return RolloutBackendConfig(
        name=backend_name,
        local=LocalConfig(
            allow_internet_tasks=opts.allow_internet_tasks,
            max_workspace_bytes=workspace_bytes,
            sandbox=sandbox_mode,
            images=images,
            warm_pool=opts.concurrency if opts.warm_pool else 0,
            warm_dir=opts.out / "warm",
        ),
        kubernetes=KubeOptions(
            kubeconfig=opts.kubeconfig,
            pod=PodSettings(
                namespace=opts.kube_namespace,
                harness_image=opts.harness_image,
                egress_canary=opts.kube_egress_canary,
                cpu_request=opts.kube_cpu_request,
            ),
            image_sink=opts.kube_image_sink,
            images=images,
            max_workspace_bytes=workspace_bytes,
        ),
    )


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
        from openforge.cli.rollouts_play import play
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
        return play(self.console, orch, plan(self.dataset, self.n, run_id=run_dir.name), label)


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
