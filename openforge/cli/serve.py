"""``openforge serve``: streaming training from live traffic, the three services apart.

``openforge serve`` starts the proxy (open mode), the pipeline job and the trainer as separate
processes on one event log (:mod:`openforge.serve.apart`), restarts any that exits, and stops
them all on Ctrl-C or SIGTERM. ``openforge traffic`` plays simulated users against a proxy
(:mod:`openforge.traffic`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from openforge.cli.options import options_command
from openforge.cli.paths import absolute_location
from openforge.cli.pipeline import ON_MISSING_REWARD, REWARD_REQUIRED, REWARD_WEIGHTS
from openforge.traffic.harness_users import HARNESS_USERS
from schemas.registry import one_of
from trainer.backends import BackendName

if TYPE_CHECKING:
    from infra.proxy_client import ProxyAdmin
    from openforge.serve.apart import ApartConfig


@dataclass(frozen=True)
class ServeOptions:
    """``openforge serve``'s options: one field per option."""

    log: Annotated[
        str,
        typer.Option(
            help="Event log: kafka://HOST:PORT[?partitions=N] (or local:DIR on one machine).",
            parser=absolute_location,
        ),
    ]
    vllm: Annotated[str, typer.Option(help="vLLM base URL (LoRA enabled), e.g. http://H:P.")]
    model: Annotated[
        Path, typer.Option(help="The model vLLM serves (the trainer's start).", resolve_path=True)
    ]
    out: Annotated[
        Path,
        typer.Option(help="Credentials, logs, spool, checkpoints, archive.", resolve_path=True),
    ] = Path("runs/serve")
    host: Annotated[str, typer.Option(help="Address the proxy binds.")] = "127.0.0.1"
    port: Annotated[int, typer.Option(help="Port the proxy binds.")] = 8100
    session_idle: Annotated[
        float, typer.Option(help="Seconds without a call after which a session's rollout ends.")
    ] = 1800.0
    lateness: Annotated[
        float, typer.Option(help="Seconds a finished session waits for its required rewards.")
    ] = 3600.0
    reward_weight: REWARD_WEIGHTS = None
    reward_required: REWARD_REQUIRED = None
    on_missing_reward: ON_MISSING_REWARD = "dead_letter"
    lr: Annotated[float, typer.Option(help="The trainer's learning rate.")] = 1e-3
    episodes_per_update: Annotated[
        int, typer.Option(help="Episodes (sessions) each update waits for.")
    ] = 4
    max_staleness: Annotated[
        int, typer.Option(help="Drop an episode more policy versions behind than this.")
    ] = 8
    trainer_backend: Annotated[
        BackendName,
        typer.Option(help=f"{one_of(BackendName)} (cpu: the reference, one process; verl: FSDP)."),
    ] = BackendName.CPU
    trainer_ranks: Annotated[
        int, typer.Option(help="Trainer processes under torchrun, one per GPU (verl only).")
    ] = 1
    pipeline_workers: Annotated[
        int,
        typer.Option(help="Pipeline jobs, each on its share of the partitions (needs as many)."),
    ] = 1
    judge: Annotated[
        bool,
        typer.Option(
            help="Score each finished session with a rubric through a model (called directly, "
            "never recorded): a reward named 'judge' to weight or require."
        ),
    ] = False
    judge_model: Annotated[
        str | None,
        typer.Option(help="The judge's model (default: the first its server lists: the base)."),
    ] = None
    judge_url: Annotated[
        str | None, typer.Option(help="The judge's model server (default: --vllm).")
    ] = None
    promotion_prompts: Annotated[
        Path | None,
        typer.Option(
            help="Safe promotion: held-out prompts (JSONL); a new policy is served only if the "
            "judge scores its answers no worse than the served policy's (within the allowance).",
            resolve_path=True,
        ),
    ] = None
    promotion_max_regression: Annotated[
        float, typer.Option(help="How much worse (0-1 scale) a promoted policy may score.")
    ] = 0.0


@options_command(ServeOptions)
def serve(opts: ServeOptions) -> None:
    """Serve live traffic and train on it: proxy, pipeline and trainer as three processes."""
    from openforge.serve.apart import ApartConfig, Service, ServicesApart

    config = ApartConfig(
        opts.log,
        opts.vllm,
        opts.model,
        opts.out,
        host=opts.host,
        port=opts.port,
        session_idle_s=opts.session_idle,
        lateness_s=opts.lateness,
        reward_weights=tuple(opts.reward_weight or ("feedback=1",)),
        reward_required=tuple(opts.reward_required or ()),
        on_missing_reward=opts.on_missing_reward,
        lr=opts.lr,
        episodes_per_update=opts.episodes_per_update,
        max_staleness=opts.max_staleness,
        trainer_backend=opts.trainer_backend,
        trainer_ranks=opts.trainer_ranks,
        pipeline_workers=opts.pipeline_workers,
        judge=opts.judge,
        judge_model=opts.judge_model,
        judge_url=opts.judge_url,
        promotion_prompts=opts.promotion_prompts,
        promotion_max_regression=opts.promotion_max_regression,
    )
    # SIGTERM stops like Ctrl-C; SIGINT too where a shell started this in the background.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with ServicesApart(config) as services:
        for service in (Service.PROXY, Service.TRAINER, Service.PIPELINE):
            services.start(service)
        _say_where(config, opts.out)
        try:
            while True:
                for service in services.exited():
                    typer.echo(f"{service.value} exited; starting it again", err=True)
                    services.start(service)
                time.sleep(1.0)
        except KeyboardInterrupt:
            typer.echo("stopping")


def _say_where(config: ApartConfig, out: Path) -> None:
    url = config.proxy_url
    typer.echo(f"proxy {url} (open mode); running; press Ctrl-C to stop")
    typer.echo(f"  Chat Completions / Responses: {url}/v1   Anthropic Messages: {url}")
    typer.echo(f"  feedback: POST {url}/sessions/SESSION/reward with {out}/feedback-token")
    typer.echo(f"  admin token: {out}/admin-token; logs: {out}/logs; trainer: {out}/trainer")


@dataclass(frozen=True)
class TrafficOptions:
    """The options of ``traffic``."""

    proxy: Annotated[str, typer.Option(help="The proxy's base URL, e.g. http://127.0.0.1:8100.")]
    users: Annotated[int, typer.Option(help="Concurrent simulated users.")] = 4
    sessions: Annotated[
        int, typer.Option(help="Sessions in all (at most, with --until-version).")
    ] = 12
    until_version: Annotated[
        int | None,
        typer.Option(
            help="Go on until the proxy stamps this policy version (a trainer behind it)."
        ),
    ] = None
    turns: Annotated[int, typer.Option(help="Calls per session.")] = 2
    feedback_fraction: Annotated[
        float, typer.Option(help="Share of sessions that get feedback (the rest: never).")
    ] = 0.75
    feedback_delay: Annotated[
        float, typer.Option(help="Feedback comes up to this many seconds after a session.")
    ] = 5.0
    max_tokens: Annotated[int, typer.Option(help="Generation budget of each call.")] = 16
    feedback_token: Annotated[
        str | None, typer.Option(envvar="OPENFORGE_FEEDBACK_TOKEN", help="Feedback credential.")
    ] = None
    feedback_token_file: Annotated[
        Path | None,
        typer.Option(help="Read the feedback credential from this file.", resolve_path=True),
    ] = None
    seed: Annotated[int, typer.Option(help="Seed of the sessions' plans.")] = 0
    harness: Annotated[
        list[str] | None,
        typer.Option(
            help="A real harness that plays sessions too, in turn with the dialects: "
            f"{one_of(HARNESS_USERS)} (repeatable; installed by scripts/setup harnesses)."
        ),
    ] = None


@options_command(TrafficOptions)
def traffic(opts: TrafficOptions) -> None:
    """Simulated users: multi-turn sessions in all three dialects (and real harnesses, with
    --harness) through a proxy in open mode, with feedback late for some sessions and never for
    others; prints the counts."""
    from infra.proxy_client import ProxyAdmin
    from openforge.traffic.simulate import TrafficConfig, run

    feedback_token = opts.feedback_token
    if opts.feedback_token_file is not None:
        feedback_token = opts.feedback_token_file.read_text().strip()
    cfg = TrafficConfig(
        opts.proxy,
        users=opts.users,
        sessions=opts.sessions,
        turns=opts.turns,
        feedback_fraction=opts.feedback_fraction,
        feedback_delay_s=(0.0, opts.feedback_delay),
        max_tokens=opts.max_tokens,
        feedback_token=feedback_token,
        seed=opts.seed,
        harnesses=tuple(opts.harness or ()),
    )
    with contextlib.closing(ProxyAdmin(opts.proxy.rstrip("/"), timeout=10)) as admin:
        keep_going = (
            (lambda: True) if opts.until_version is None else _below(admin, opts.until_version)
        )
        report = run(cfg, keep_going)
        version = admin.policy_version()
    for line in report.failures():
        typer.echo(line, err=True)
    counts = report.counts()
    typer.echo(json.dumps({**counts, "policy_version": version}))
    played = counts["harness_sessions"] - counts["harness_sessions_failed"]
    if counts["calls_answered"] == 0 and played == 0:
        raise typer.Exit(1)  # nothing succeeded
    if opts.until_version is not None and version < opts.until_version:
        typer.echo(
            f"the policy version is {version}, not {opts.until_version}, after "
            f"{opts.sessions} sessions",
            err=True,
        )
        raise typer.Exit(1)


def _below(admin: ProxyAdmin, version: int) -> Callable[[], bool]:
    """Whether the proxy still stamps a version below ``version`` (asked once a second)."""
    asked, below = 0.0, True

    def check() -> bool:
        nonlocal asked, below
        if time.monotonic() - asked >= 1.0:
            asked, below = time.monotonic(), admin.policy_version() < version
        return below

    return check
