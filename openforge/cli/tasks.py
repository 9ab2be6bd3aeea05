"""``openforge tasks``: build a Harbor task set's images and check it before training on it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.console import Console

    from infra.images.store import ImageStore
    from infra.tasks import Task
    from orchestrator.backend import RolloutBackend

app = typer.Typer(help="Build and check Harbor tasks.", no_args_is_help=True)


@app.command("build")
def build(
    path: Annotated[
        Path, typer.Argument(help="A task, a directory of tasks, or a manifest.", resolve_path=True)
    ],
    strict_images: Annotated[
        bool, typer.Option(help="Refuse a FROM with no exact local image (no stand-in).")
    ] = False,
    pull_images: Annotated[
        bool, typer.Option(help="Let buildah pull a FROM the local store lacks.")
    ] = False,
    push: Annotated[
        str | None,
        typer.Option(
            metavar="REGISTRY",
            help="Push each image to this registry (HOST:PORT/PREFIX, port and prefix "
            "optional; TLS unless the host is localhost), for a cluster to pull; credentials: "
            "`buildah login HOST`.",
        ),
    ] = None,
    harness_name: Annotated[
        str | None,
        typer.Option(
            "--harness",
            help="With --push: push each image with this harness's install added, as the "
            "Kubernetes backend runs it (agent, claude-code, codex, openclaw).",
        ),
    ] = None,
) -> None:
    """Build the image of every task with a Dockerfile (or find it cached): one line per task,
    built, cached or refused (why), and where it was pushed; exit 1 if any could not be built
    or pushed."""
    import time

    from rich.console import Console

    from infra.images import ImageBuilder, ImagePolicy
    from infra.tasks import dataset_entries, load_task
    from openforge.cli.userns import enter_for_containers
    from schemas.errors import OpenForgeError

    enter_for_containers()
    console = Console(soft_wrap=True)  # a path is never broken across lines
    builder = ImageBuilder(policy=ImagePolicy(strict=strict_images, pull=pull_images))
    publish = _publisher(push, harness_name, builder.store)
    entries = list(dataset_entries(path))
    failed, start = 0, time.monotonic()
    for i, (task_dir, task_split, task_id) in enumerate(entries, start=1):
        name = task_id or task_dir.name
        try:
            task = load_task(task_dir, task_id=task_id, split=task_split)
            if task.dockerfile is None and not task.environment.docker_image:
                console.print(f"[{i}/{len(entries)}] {task.id}: no Dockerfile (runs in bubblewrap)")
                continue
            image = builder.image(task, say=lambda line: console.print(f"  {line}"))
            console.print(f"[{i}/{len(entries)}] {task.id}: {image.describe()}")
            if publish is not None:
                console.print(f"  pushed {publish(image.ref)}")
        except OpenForgeError as exc:
            failed += 1
            console.print(f"[{i}/{len(entries)}] [red]{name}: refused[/]: {exc}")
    console.print(
        f"{len(entries)} tasks: {len(entries) - failed} ready, {failed} refused "
        f"in {time.monotonic() - start:.1f}s; images in {builder.store.root}"
    )
    if failed or not entries:
        raise typer.Exit(1)


def _publisher(
    registry: str | None, harness_name: str | None, store: ImageStore
) -> Callable[[str], str] | None:
    """What ``--push``/``--harness`` make of a built image: a function from its local name to
    where it was pushed (None: no push)."""
    from infra.harnesses import harness
    from infra.images.layers import install_of, with_install
    from infra.images.sinks import image_sink
    from schemas.errors import ConfigError

    if registry is None:
        if harness_name is not None:
            raise ConfigError("--harness says which install --push adds: give --push REGISTRY too")
        return None
    url = registry if registry.startswith("registry://") else f"registry://{registry}"
    sink = image_sink(url, store)
    install = None if harness_name is None else install_of(harness(harness_name))

    def publish(ref: str) -> str:
        return sink.publish(ref if install is None else with_install(store, ref, install))

    return publish


@app.command("check")
def check(
    path: Annotated[
        Path, typer.Argument(help="A task, a directory of tasks, or a manifest.", resolve_path=True)
    ],
    out: Annotated[
        Path, typer.Option(help="Where the oracle's run directory goes.", resolve_path=True)
    ] = Path("runs/tasks-check"),
    oracle: Annotated[bool, typer.Option(help="Run the oracle where a solution exists.")] = True,
    allow_internet_tasks: Annotated[
        bool, typer.Option(help="Accept allow_internet tasks (run without internet).")
    ] = False,
    sandbox: Annotated[
        str,
        typer.Option(help="auto (a task with a Dockerfile in a container), container, bubblewrap."),
    ] = "auto",
    strict_images: Annotated[
        bool, typer.Option(help="Refuse a FROM with no exact local image (no stand-in).")
    ] = False,
) -> None:
    """Load every task, build its image (or say why not), say where it runs and from which base,
    and run the oracle (the task's own solution) where there is one: a table at the end."""
    from rich.console import Console

    from infra.harnesses import Oracle
    from infra.images import ImagePolicy
    from openforge.cli.userns import enter_for_containers
    from openforge.stack import local_stack
    from orchestrator.backend import RolloutBackendName, RunProxy
    from orchestrator.environments import SandboxMode
    from orchestrator.local import LocalConfig
    from orchestrator.plan import plan
    from orchestrator.registry import RolloutBackendConfig, build_backend
    from orchestrator.run import Orchestrator, OrchestratorConfig
    from orchestrator.rundir import RunDir
    from schemas.registry import choose

    mode = choose(SandboxMode, sandbox, "sandbox")
    enter_for_containers(mode)
    console = Console(soft_wrap=True)  # a path is never broken across lines
    with local_stack(out / "services", needs_model=False, say=lambda _: None) as stack:
        local = LocalConfig(
            allow_internet_tasks=allow_internet_tasks,
            sandbox=mode,
            images=ImagePolicy(strict=strict_images),
        )
        run_proxy = RunProxy(stack.admin.url, stack.endpoint)
        backend = build_backend(RolloutBackendConfig(RolloutBackendName.LOCAL, local), run_proxy)
        rows, runnable = _check_each(console, backend, path)
        if oracle and runnable:
            orch = Orchestrator(
                backend, Oracle(), stack.admin, RunDir(out), OrchestratorConfig(max_attempts=1)
            )
            for outcome in orch.run(plan(runnable, 1, run_id=out.name)):
                rows[outcome.task_id][2] = (
                    f"{outcome.reward:.3f}" if outcome.reward is not None else outcome.status.value
                )
    if not _report(console, rows):
        raise typer.Exit(1)


def _check_each(
    console: Console, backend: RolloutBackend, path: Path
) -> tuple[dict[str, list[str]], list[Task]]:
    """Each task loaded and checked by ``backend``, one at a time so that one malformed task
    does not hide the others: a row per task (runs in, what was said or why refused, oracle),
    and the tasks with a solution."""
    from infra.harnesses import NoOp, Oracle
    from infra.tasks import dataset_entries, harbor, load_task
    from schemas.errors import OpenForgeError

    rows: dict[str, list[str]] = {}
    runnable: list[Task] = []
    for task_dir, task_split, task_id in dataset_entries(path.resolve()):
        name = task_id or task_dir.name
        try:
            task = load_task(task_dir, task_id=task_id, split=task_split)
            name = task.id
            console.print(f"checking {name} ...")
            notes = backend.check(task, Oracle() if harbor.has_solution(task) else NoOp())
        except OpenForgeError as exc:  # a malformed task, or one this backend refuses
            rows[name] = ["refused", str(exc), "-"]
            continue
        said = "; ".join(n.split(": ", 1)[1] for n in notes) or "-"
        rows[name] = [backend.runs_in(task), said, "-"]
        if not harbor.has_solution(task):
            rows[name][2] = "no solution"
        else:
            runnable.append(task)
    return rows, runnable


def _report(console: Console, rows: dict[str, list[str]]) -> bool:
    """The table and its count line; False when a task was refused or its oracle scored
    below 1."""
    from rich.table import Table

    table = Table("task", "runs in", "image and base / why not", "oracle reward")
    for name, (ok, why, reward) in sorted(rows.items()):
        table.add_row(name, ok, why, reward)
    console.print(table)
    refused = [n for n, r in rows.items() if r[0] == "refused"]
    unsolved = [n for n, r in rows.items() if r[2] not in ("-", "no solution", "1.000")]
    console.print(
        f"{len(rows)} tasks: {len(rows) - len(refused)} runnable here, {len(refused)} refused; "
        f"oracle below 1 on {len(unsolved)}"
    )
    return not (refused or unsolved)
