"""``openforge train CONFIG``: the main job, an RL run through every real part.

openforge train examples/cpu-demo.toml --set trainer.lr=0 --set run.output_dir=runs/control
openforge train --show-config          # every field, its default and what it does
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from infra.harnesses import HARNESSES

if TYPE_CHECKING:
    from rich.console import Console

    from openforge.train.config import TrainConfig

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "cpu-demo.toml"


def train(
    config: Annotated[
        Path | None, typer.Argument(help="The run's TOML config.", resolve_path=True)
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one field: section.key=value (repeatable)."),
    ] = None,
    proxy_workers: Annotated[
        int | None,
        typer.Option(
            help="Proxy worker processes (the config's proxy.workers; default 1): each "
            "rollout's harness calls its own worker."
        ),
    ] = None,
    show_config: Annotated[
        bool, typer.Option(help="Print every field with its default and description, and exit.")
    ] = False,
    harness: Annotated[
        str | None,
        typer.Option(
            help=f"Harnesses to compare, comma-separated ({HARNESSES.listing()}; e.g. "
            "agent,codex,claude-code): the "
            "config trained once per harness on equal terms, each into a subdirectory of the "
            "run's output directory named after it, and compared there in comparison.png, "
            ".json and .html."
        ),
    ] = None,
) -> None:
    """Train with RL: warm start, vLLM, proxy, pipeline, sandboxed rollouts, trainer, evals."""
    from rich.console import Console

    from openforge.train.config_io import describe, load_config

    console = Console(soft_wrap=True)  # a path is never broken across lines
    if show_config:
        console.print(describe(), markup=False, highlight=False)
        return
    overrides = [*(set_ or [])]
    if proxy_workers is not None:  # checked with the rest when the config is built
        overrides.append(f"proxy.workers={proxy_workers}")
    if harness is None:
        _train_one(load_config(config, overrides), console)
        return
    _compare(config, overrides, [h.strip() for h in harness.split(",") if h.strip()], console)


def _compare(config: Path | None, overrides: list[str], names: list[str], console: Console) -> None:
    """One run per harness, each with its own overrides, then the comparison of them all."""
    from openforge.train.compare import harness_overrides, write_comparison
    from openforge.train.config_io import load_config

    output_dir = Path(load_config(config, overrides).run.output_dir)
    per_harness = harness_overrides(names, output_dir)
    configs = {n: load_config(config, [*overrides, *o]) for n, o in per_harness.items()}
    runs = {n: _train_one(cfg, console) for n, cfg in configs.items()}  # checked first, all
    for path in write_comparison(output_dir, runs):
        console.print(f"comparison: {path}")


def _train_one(cfg: TrainConfig, console: Console) -> Path:
    """One training run of ``cfg``, reported; its run directory."""
    from openforge.cli.userns import enter_for_containers
    from openforge.train.report import live_progress, progress_text
    from openforge.train.report import summary_table as table
    from openforge.train.run import TrainingRun
    from orchestrator.backend import RolloutBackendName

    if cfg.rollouts.backend is RolloutBackendName.LOCAL:
        enter_for_containers(cfg.rollouts.sandbox)
    # SIGTERM unwinds like Ctrl-C: sandboxes, the pipeline, the proxy and vLLM are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run = TrainingRun(cfg, say=console.print)
    if not console.is_terminal:  # a log file or CI: one progress line per update instead
        run.on_update = lambda: console.print(progress_text(run))
    console.print(f"run directory {run.root}")
    try:
        with live_progress(console, run):
            report = run.run()
    except KeyboardInterrupt:
        console.print("[yellow]stopped[/]: everything started was stopped; rerun to resume")
        raise typer.Exit(130) from None
    console.print(table(report.metrics, run.evals.rows))
    result = report.summary
    updates = "1 update" if result.updates == 1 else f"{result.updates} updates"
    console.print(
        f"{updates} in {result.seconds:.0f} s; held-out reward "
        f"{_f(result.heldout_initial)} (v0) -> {_f(result.heldout_final)} "
        f"(v{result.policy_version}); train reward {_f(result.train_first)} -> "
        f"{_f(result.train_last)}"
    )
    if result.faults:
        rates = ", ".join(f"{kind} {rate:g}" for kind, rate in sorted(result.faults.items()))
        console.print(f"faults were injected into the training rollouts: {rates}")
    if result.heldout_faulted:  # faults.heldout = "both"
        versions = sorted(result.heldout_faulted)
        first, last = (result.heldout_faulted[v] for v in (versions[0], versions[-1]))
        console.print(
            f"held-out reward with a sandbox fault in each rollout {_f(first)} "
            f"(v{versions[0]}) -> {_f(last)} (v{versions[-1]})"
        )
    metrics_csv = run.root / "trainer" / "metrics.csv"
    console.print(
        f"curves: {report.curves}; metrics: {metrics_csv}; summary: {run.root / 'summary.json'}"
    )
    _fail_if_rollouts_gave_up(console, run.root)
    return run.root


def _fail_if_rollouts_gave_up(console: Console, root: Path) -> None:
    """Exit 1 when any rollout (training or held-out) gave up after infrastructure failures:
    the report is written, but the run is no success; print the first failure and its files."""
    from orchestrator.rundir import RunDir, Status

    for job in RunDir.found_in(root):
        failed = [o for o in job.outcomes() if o.status is Status.INFRA_FAILED]
        if failed:
            first = failed[0]
            console.print(
                f"[bold red]{len(failed)} {job.root.name} gave up after infrastructure "
                f"failures[/]; the first ({first.rollout_id}): {first.message.strip()[:1500]}"
                f"\n  its files: {job.rollout_root(first.rollout_id)}"
            )
            raise typer.Exit(1)


def demo() -> None:
    """The main job on its defaults: `openforge train examples/cpu-demo.toml`."""
    train(DEMO_CONFIG, [], show_config=False, harness=None)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
