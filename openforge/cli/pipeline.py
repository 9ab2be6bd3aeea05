"""``openforge pipeline``: assemble episodes from the event log (streaming) or an archive.

Both jobs run on Beam's in-process FnApiRunner by default; ``--beam-arg=--runner=PrismRunner``
asks for Beam's portable runner Prism instead (``scripts/setup prism`` builds it), and other
runners take their own Beam options (docs/pipeline.md: Flink, Dataflow). Each run ends with one line
naming its runner and its counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from openforge.cli.paths import absolute_location
from schemas.errors import ConfigError

if TYPE_CHECKING:
    from infra.judge import JudgeConfig

app = typer.Typer(help="Beam jobs: events -> episodes (with rewards joined).", no_args_is_help=True)

BEAM_ARGS = typer.Option(
    help="A Beam pipeline option (repeatable). Default runner: FnApiRunner (in this process); "
    "e.g. --beam-arg=--runner=PrismRunner, --beam-arg=--runner=FlinkRunner.",
)


REWARD_WEIGHTS = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME=WEIGHT: the training reward is the weighted sum of the rollout's named "
        "reward values (components, and each source's scalar under its verifier name); "
        "repeat per name. Default: the newest reward event's scalar."
    ),
]
REWARD_REQUIRED = Annotated[
    list[str] | None,
    typer.Option(help="A reward name an episode waits for (repeat per name)."),
]
ON_MISSING_REWARD = Annotated[
    str,
    typer.Option(
        help="At the deadline, a rollout missing a required reward is dead-lettered "
        "(dead_letter) or trained with what it has (train)."
    ),
]


@app.command("run")
def run(
    source: Annotated[
        str,
        typer.Option(help="Event log: kafka://HOST:PORT or local:DIR.", parser=absolute_location),
    ],
    to: Annotated[
        str | None,
        typer.Option(
            help="Event log for episodes (default: the source).", parser=absolute_location
        ),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option(
            help="Also write episodes to DIR/episodes/, dead letters to DIR/deadletter/.",
            parser=absolute_location,
        ),
    ] = None,
    run_archive: Annotated[
        str | None,
        typer.Option(
            help="One archive root for the events read, the episodes and the dead letters "
            "(what openforge train keeps in RUN/archive/).",
            parser=absolute_location,
        ),
    ] = None,
    lateness: Annotated[
        float, typer.Option(help="Seconds a rollout waits for its reward.")
    ] = 600.0,
    stop_when_idle: Annotated[
        float | None, typer.Option(help="Stop after this many idle seconds.")
    ] = None,
    reward_weight: REWARD_WEIGHTS = None,
    reward_required: REWARD_REQUIRED = None,
    on_missing_reward: ON_MISSING_REWARD = "dead_letter",
    beam_arg: Annotated[list[str] | None, BEAM_ARGS] = None,
    worker: Annotated[
        str,
        typer.Option(
            help="I/N: one of N jobs on one log, reading the partitions p with p % N == I "
            "(a rollout's events share a partition; the topic needs N or more)."
        ),
    ] = "0/1",
    judge_url: Annotated[
        str | None,
        typer.Option(
            help="Score each finished rollout with a rubric through this model server "
            "(http://HOST:PORT, OpenAI-compatible; called directly, never recorded): a reward "
            "named 'judge' (weight or require it like any other)."
        ),
    ] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="The judge's model on --judge-url (default: its first).")
    ] = None,
    judge_rubric: Annotated[
        Path | None,
        typer.Option(
            help="A text file: what a good session is (default: a general rubric).",
            resolve_path=True,
        ),
    ] = None,
    judge_constraint: Annotated[
        str,
        typer.Option(
            help="vllm: the answer constrained to 0-10 (vLLM's structured outputs); none: the "
            "standard API only, the first integer 0-10 of the answer taken."
        ),
    ] = "vllm",
) -> None:
    """Streaming: read events, assemble episodes, write them to the episodes topic."""
    from pipeline.jobs import Outputs, run_streaming
    from pipeline.rewards import RewardPolicy
    from pipeline.shards import Shard

    shard = Shard.parse(worker)  # a bad one fails before anything starts
    judge = _judge(judge_url, judge_model, judge_rubric, judge_constraint)
    policy = RewardPolicy.of_options(reward_weight or [], reward_required or [], on_missing_reward)
    report = run_streaming(
        source,
        Outputs(to or source, archive, run_archive),
        beam_arg or [],
        lateness,
        stop_when_idle,
        policy=policy,
        shard=shard,
        judge=judge,
    )
    typer.echo(report.line())


def _judge(
    url: str | None, model: str | None, rubric: Path | None, constraint: str
) -> JudgeConfig | None:
    """The judge the options ask for (None without --judge-url)."""
    from infra.judge import DEFAULT_RUBRIC, Constraint, JudgeConfig, served_model
    from schemas.registry import choose

    if url is None:
        if model or rubric:
            raise ConfigError("--judge-model and --judge-rubric need --judge-url")
        return None
    if rubric is not None and not rubric.is_file():
        raise ConfigError(f"--judge-rubric {rubric}: no such file")
    text = rubric.read_text() if rubric is not None else DEFAULT_RUBRIC
    mode = choose(Constraint, constraint, "judge constraint")
    return JudgeConfig(url, model or served_model(url), text, mode)


@app.command("replay")
def replay(
    from_: Annotated[
        str, typer.Option("--from", help="Parquet archive of events.", parser=absolute_location)
    ],
    to: Annotated[
        str, typer.Option(help="Archive dir for the rebuilt episodes.", parser=absolute_location)
    ],
    log: Annotated[
        str | None,
        typer.Option(help="Also publish episodes to this event log.", parser=absolute_location),
    ] = None,
    lateness: Annotated[
        float, typer.Option(help="Seconds a rollout waits for its reward.")
    ] = 600.0,
    reward_weight: REWARD_WEIGHTS = None,
    reward_required: REWARD_REQUIRED = None,
    on_missing_reward: ON_MISSING_REWARD = "dead_letter",
    beam_arg: Annotated[list[str] | None, BEAM_ARGS] = None,
) -> None:
    """Batch: rebuild every episode from an archive of events."""
    from pipeline.jobs import Outputs, run_replay
    from pipeline.rewards import RewardPolicy

    policy = RewardPolicy.of_options(reward_weight or [], reward_required or [], on_missing_reward)
    typer.echo(run_replay(from_, Outputs(log, to), beam_arg or [], lateness, policy).line())
