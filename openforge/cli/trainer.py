"""``openforge trainer``: train on finished episodes, streaming."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from openforge.cli.options import options_command
from openforge.cli.paths import absolute_location
from schemas.errors import ConfigError
from trainer.algorithm_names import AdvantageEstimator, PolicyLoss
from trainer.backends import BackendName

if TYPE_CHECKING:
    from infra.engine_meter import EngineMeter
    from trainer.loop import TrainerConfig
    from trainer.promotion import HeldOutJudge
    from trainer.weight_sync import WeightSync

app = typer.Typer(
    help="Off-policy-corrected RL on episodes (veRL's algorithms).", no_args_is_help=True
)


@dataclass(frozen=True)
class TrainerRunOptions:
    """``openforge trainer run``'s options: one field per option."""

    episodes: Annotated[
        str,
        typer.Option(help="kafka://HOST:PORT, local:DIR or archive:DIR.", parser=absolute_location),
    ]
    model: Annotated[
        Path, typer.Option(help="Base model directory (Hugging Face format).", resolve_path=True)
    ]
    out: Annotated[
        Path, typer.Option(help="Checkpoints, metrics and plots go here.", resolve_path=True)
    ] = Path("run")
    lora_rank: Annotated[int, typer.Option(help="LoRA rank; 0 trains full weights.")] = 8
    backend: Annotated[
        BackendName,
        typer.Option(help="cpu (reference) or verl (veRL's FSDP engine; torchrun on GPUs)."),
    ] = BackendName.CPU
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3
    advantage: Annotated[
        AdvantageEstimator, typer.Option(help="veRL advantage estimator: grpo, rloo, ...")
    ] = AdvantageEstimator.GRPO
    policy_loss: Annotated[
        PolicyLoss, typer.Option(help="veRL policy loss: vanilla, gspo, ...")
    ] = PolicyLoss.VANILLA
    rollout_is: Annotated[str, typer.Option(help="IS correction: token, sequence or none.")] = (
        "token"
    )
    is_threshold: Annotated[float, typer.Option(help="IS weight truncation.")] = 2.0
    rollout_rs: Annotated[str | None, typer.Option(help="Rejection mask, e.g. token_icepop.")] = (
        None
    )
    group_size: Annotated[int, typer.Option(help="Episodes per task group.")] = 4
    token_budget: Annotated[int, typer.Option(help="Tokens per batch.")] = 16384
    max_staleness: Annotated[int, typer.Option(help="Admitted policy-version lag.")] = 4
    stale: Annotated[str, typer.Option(help="Beyond it: drop or keep (counted).")] = "drop"
    groups_per_batch: Annotated[
        int | None,
        typer.Option(
            help="Each update waits for exactly this many whole groups (default: whatever is "
            "ready, up to --token-budget)."
        ),
    ] = None
    group_timeout: Annotated[
        float | None,
        typer.Option(help="Release a group still incomplete after this long (s); 0: never."),
    ] = 600.0
    steps: Annotated[int | None, typer.Option(help="Stop after this many updates.")] = None
    idle_timeout: Annotated[float | None, typer.Option(help="Stop when idle this long (s).")] = None
    vllm: Annotated[str | None, typer.Option(help="vLLM URL to hot-load adapters into.")] = None
    proxy: Annotated[str | None, typer.Option(help="Proxy URL whose policy version to bump.")] = (
        None
    )
    admin_token: Annotated[str | None, typer.Option(envvar="OPENFORGE_ADMIN_TOKEN")] = None
    lora_name: Annotated[str, typer.Option(help="Adapter name served by vLLM.")] = "policy"
    serve_at_start: Annotated[
        bool,
        typer.Option(
            help="With --vllm: serve the starting weights before the first update (version 0 "
            "when fresh, else the next version); for a trainer in front of live traffic."
        ),
    ] = False
    archive: Annotated[
        Path | None,
        typer.Option(
            help="Archive root for one lineage record per update (query: steps).", resolve_path=True
        ),
    ] = None
    promotion_prompts: Annotated[
        Path | None,
        typer.Option(
            help='Safe promotion: a JSONL file of held-out prompts ({"prompt": ...} or '
            '{"messages": [...]} per line); each candidate answers them beside the served '
            "policy, a judge scores both, and one that regresses is not served.",
            resolve_path=True,
        ),
    ] = None
    promotion_judge_model: Annotated[
        str | None, typer.Option(help="The gate's judge model (default: the first --vllm serves).")
    ] = None
    promotion_judge_url: Annotated[
        str | None, typer.Option(help="The gate judge's model server (default: --vllm).")
    ] = None
    promotion_max_regression: Annotated[
        float,
        typer.Option(
            help="Serve a candidate whose held-out score is at most this much below the served "
            "policy's (0-1 scale; negative: it must improve by that much)."
        ),
    ] = 0.0
    promotion_max_tokens: Annotated[int, typer.Option(help="Tokens of each held-out answer.")] = 64


@app.command("run")
@options_command(TrainerRunOptions)
def run(opts: TrainerRunOptions) -> None:
    """Consume episodes, update the policy, hand weights to vLLM, checkpoint; resumable."""
    from infra.engine_meter import EngineMeter
    from trainer.loop import train as _train
    from trainer.weight_sync import SyncMode, WeightSync

    _log_progress()
    # Full-weight training is served by reloading every weight; a LoRA adapter is hot-loaded.
    mode = SyncMode.LORA if opts.lora_rank else SyncMode.FULL
    sync = (
        WeightSync(opts.vllm, opts.lora_name, opts.proxy, opts.admin_token, mode=mode)
        if opts.vllm
        else None
    )
    gate = _gate(
        sync, opts.promotion_prompts, opts.promotion_judge_url, opts.promotion_judge_model,
        opts.promotion_max_regression, opts.promotion_max_tokens,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(EngineMeter(opts.vllm)) if opts.vllm else None
        summary = _train(_config(opts, sync, engine, gate))
    served = "" if sync else " (no --vllm: the weights stay in the checkpoints, none served)"
    typer.echo(
        f"{summary['steps']} steps, policy version {summary['policy_version']}{served}, "
        f"metrics in {opts.out}/metrics.csv"
    )


def _config(
    opts: TrainerRunOptions,
    sync: WeightSync | None,
    engine: EngineMeter | None,
    gate: HeldOutJudge | None,
) -> TrainerConfig:
    """The trainer's config from the command's options."""
    from schemas.registry import choose
    from trainer.algorithms import AlgorithmConfig
    from trainer.loop import TrainerConfig
    from trainer.stream import StalePolicy, StreamConfig

    return TrainerConfig(
        episodes=opts.episodes,
        model_dir=opts.model,
        out_dir=opts.out,
        lora_rank=opts.lora_rank or None,
        backend=opts.backend,
        lr=opts.lr,
        algo=AlgorithmConfig(
            advantage=opts.advantage,
            policy_loss=opts.policy_loss,
            rollout_is=None if opts.rollout_is == "none" else opts.rollout_is,
            rollout_is_threshold=opts.is_threshold,
            rollout_rs=opts.rollout_rs,
        ),
        stream=StreamConfig(
            opts.group_size,
            opts.token_budget,
            opts.max_staleness,
            choose(StalePolicy, opts.stale, "stale policy"),
            group_timeout_s=opts.group_timeout or None,
            groups_per_batch=opts.groups_per_batch,
        ),
        steps=opts.steps,
        idle_timeout=opts.idle_timeout,
        sync=sync,
        archive=opts.archive,
        engine=engine,
        serve_at_start=opts.serve_at_start,
        gate=gate,
    )


def _log_progress() -> None:
    """The trainer's own log (waiting for vLLM, each policy served or held, resumes) on stderr,
    where a long-running trainer's operator reads it (``kubectl logs``)."""
    log = logging.getLogger("trainer")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _gate(
    sync: WeightSync | None,
    prompts: Path | None,
    judge_url: str | None,
    judge_model: str | None,
    max_regression: float,
    max_tokens: int,
) -> HeldOutJudge | None:
    """The promotion gate the options ask for (None without --promotion-prompts)."""
    from infra.judge import JudgeConfig, served_model
    from trainer.promotion import HeldOutJudge, load_prompts

    if prompts is None:
        if judge_url or judge_model:
            raise ConfigError("--promotion-judge-* need --promotion-prompts (the held-out set)")
        return None
    if sync is None:
        raise ConfigError("--promotion-prompts needs --vllm: the gate runs the candidate there")
    url = judge_url or sync.vllm_url
    judge = JudgeConfig(url, judge_model or served_model(url))
    return HeldOutJudge(load_prompts(prompts), judge, sync, max_regression, max_tokens)
