"""The two pipelines: streaming assembly from the event log, and batch replay from the archive.

Both are plain Beam pipelines: the runner and its options come from Beam arguments. On one
machine they run on Beam's in-process FnApiRunner by default: it keeps up with 2,000 records/s
of live load at a reward -> episode p99 of about 1 s here, where Beam's portable runner Prism
falls behind at 250/s (bench/RESULTS.md, "Where Prism's time goes"). Prism runs them when asked
(``--runner=PrismRunner``: the binary ``scripts/setup prism`` builds, with the SDK worker in
this process, ``--environment_type=LOOPBACK``); it speaks the same Job and Fn API as Flink and
Dataflow (see docs/pipeline.md for their options), so it is the one-machine check of a job bound for
them. Every run is reported in one log line that names its runner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.metrics.monitoring_infos import consolidate as consolidate_monitoring_infos
from apache_beam.metrics.monitoring_infos import to_key
from apache_beam.options.pipeline_options import (
    DebugOptions,
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
    StandardOptions,
)
from apache_beam.runners.portability.fn_api_runner import fn_runner, worker_handlers

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, create_topics
from infra.judge import JudgeConfig
from infra.paths import prism_binary
from pipeline.archive import ArchiveEvents
from pipeline.assemble import DEAD_LETTER, NAMESPACE, AssembleEpisodes
from pipeline.judge import JUDGEMENTS_TOPIC, JudgeRollouts
from pipeline.rewards import RewardPolicy
from pipeline.shards import Shard
from pipeline.sinks import WriteEpisodes
from pipeline.sources import RECORDS_PER_CALL, ReadArchive, ReadEventLog
from schemas.errors import ConfigError

log = logging.getLogger(__name__)

PRISM = "PrismRunner"
DEFAULT_RUNNER = "FnApiRunner"  # on one machine, chosen by bench/pipeline_throughput.py
# Runners that run the pipeline in this process without a Job API: FnApiRunner, and the direct
# runners that fall back to it. They ignore SDF watermark estimators, so they get the
# workarounds of RunnerQuirks.
_IN_PROCESS = {"FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner"}


@dataclass
class Outputs:
    """Where episodes and dead letters go: an event-log URL and/or an archive directory.

    Attributes:
        log_url: the event log whose episodes and dead-letter topics get them.
        archive: episodes to ``ARCHIVE/episodes/``, dead letters to ``ARCHIVE/deadletter/``
            (each an archive root).
        run_archive: one archive root for everything, as ``openforge train`` keeps it in
            ``RUN/archive/``: episodes and dead letters (``record=episode``, a dead letter with
            its ``dead_letter`` reason) and, from the streaming job, the raw events it reads.
    """

    log_url: str | None = None
    archive: str | None = None
    run_archive: str | None = None

    def __post_init__(self) -> None:
        if self.archive and self.run_archive:
            raise ConfigError(
                "give the episodes one archive: --archive DIR (episodes/ and deadletter/ in "
                "it) or --run-archive DIR (one archive root), not both"
            )

    def sub(self, name: str) -> str | None:
        """The archive root for ``name`` (``episodes`` or ``deadletter``), if any."""
        if self.run_archive:
            return self.run_archive
        return f"{self.archive.rstrip('/')}/{name}" if self.archive else None


@dataclass(frozen=True)
class RunnerQuirks:
    """What a runner needs of the pipeline beyond Beam's contract.

    Attributes:
        runner: the runner's class name, as reported.
        records_per_call: records the source reads per ``process`` call. FnApiRunner ignores SDF
            watermark estimators and, after a mid-backlog checkpoint, can advance event time
            past elements it has not delivered yet: reading the backlog in one call avoids that.
        defer_early_deadlines: re-arm a reward deadline that fires before its event time has
            come by the wall clock (FnApiRunner fires timers early while it holds elements).
        emit_at_once: emit an episode as soon as its rollout is finished and rewarded, not when
            the watermark has passed its events (FnApiRunner's watermark cannot be relied on,
            and its reads, never split, deliver the log in order).
    """

    runner: str
    records_per_call: int = RECORDS_PER_CALL
    defer_early_deadlines: bool = False
    emit_at_once: bool = False


def runner_name(opts: PipelineOptions) -> str:
    runner = opts.view_as(StandardOptions).runner
    if runner is None:
        return DEFAULT_RUNNER
    return str(runner if isinstance(runner, str) else type(runner).__name__).rsplit(".", 1)[-1]


def quirks(opts: PipelineOptions) -> RunnerQuirks:
    """What the job on ``opts``'s runner needs. An in-process runner's quirks are for streaming
    jobs only: in a batch job (replay) its watermark passes each rollout's events only once all
    of them are read, so the assembly settles on every event, as on any runner (emitting at
    once there would settle on whichever reward came first of several, e.g. a re-score's)."""
    name = runner_name(opts)
    if name in _IN_PROCESS and opts.view_as(StandardOptions).streaming:
        return RunnerQuirks(
            name, records_per_call=200_000, defer_early_deadlines=True, emit_at_once=True
        )
    return RunnerQuirks(name)


STREAMING_JOB_TIMEOUT_S = 10 * 365 * 24 * 3600  # a streaming job runs until stopped


def options(
    beam_args: Sequence[str], streaming: bool, runner_splits: bool = False
) -> PipelineOptions:
    """Pipeline options from Beam arguments; with no ``--runner``, FnApiRunner in this process.

    On Prism (``--runner=PrismRunner``): Prism splits any bundle that shows no progress for a
    tick (100 ms, backing off), the assembly's bundles of event-time timers too, and mishandles
    those splits (it warns "Unexpected split on a bundle with timers", apache/beam#35771):
    episodes come out twice or short. So Prism's runner-initiated splits are off
    (``prism_disable_sdf_split``) unless ``runner_splits`` asks for them (the tests of the
    source's split contract do); the source still checkpoints after every read. Flink and
    Dataflow are not affected.
    """
    opts = PipelineOptions(list(beam_args))
    standard = opts.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = DEFAULT_RUNNER  # Beam's own default, DirectRunner, may pick Prism
    if runner_name(opts) == PRISM:
        portable = opts.view_as(PortableOptions)
        prism = opts.view_as(PrismRunnerOptions)
        if not portable.job_endpoint and not prism.prism_location:
            prism.prism_location = str(prism_binary())
        if not portable.environment_type:
            portable.environment_type = "LOOPBACK"
        if not runner_splits:
            opts.view_as(DebugOptions).add_experiment("prism_disable_sdf_split")
        # The portable runner reads the job's state and message streams with this timeout
        # (300 s by default): a streaming job would die of DEADLINE_EXCEEDED after 5 minutes.
        if (streaming or standard.streaming) and not any(
            a.startswith(("--job_server_timeout", "--job-server-timeout")) for a in beam_args
        ):
            portable.job_server_timeout = STREAMING_JOB_TIMEOUT_S
    standard.streaming = streaming or standard.streaming
    return opts


@dataclass
class RunReport:
    """What a finished run did: its runner and the pipeline's counters (``openforge.pipeline``)."""

    job: str
    runner: str
    seconds: float
    counters: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counters.items()))
        return (
            f"pipeline {self.job} on {self.runner}: {self.seconds:.1f} s; {counts or 'no counters'}"
        )


def _counters(result: Any) -> dict[str, int]:
    try:
        query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except (NotImplementedError, AttributeError):  # a runner without metrics
        return {}
    out: dict[str, int] = {}
    for counter in query["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + int(value or 0)
    return out


_CONSOLIDATE = "consolidate_monitoring_infos"


def _consolidated_list(metrics: Any, key: Any = to_key) -> list[Any]:
    return list(consolidate_monitoring_infos(metrics, key))


@contextmanager
def _in_process_runner(opts: PipelineOptions) -> Iterator[None]:
    """Two settings of an in-process runner, restored after the run.

    - The SDK state cache: ``--max_cache_memory_usage_mb``, 0 (off) by default. FnApiRunner's
      embedded worker ignores the option and sizes its cache by
      ``worker_handlers.STATE_CACHE_SIZE_MB`` (100 MB); the cache sizes every value it stores
      with objsize, a fixed cost per state write (measured in bench/RESULTS.md, "After the
      cuts"), while the state whose reads it saves is in this process anyway.
    - Its metrics, consolidated into a list after every bundle. Beam 2.77's FnApiRunner wraps
      the previous bundles' consolidation, a generator, in a new one per bundle: a streaming
      run keeps every bundle's metrics until it ends, and then fails to read them
      (RecursionError) once a stage has run ~1,000 bundles (a minute at 250 records/s here).
    """
    if runner_name(opts) not in _IN_PROCESS:
        yield
        return
    given = opts.get_all_options(drop_default=True).get("max_cache_memory_usage_mb", 0)
    runner_module = vars(fn_runner)  # the name fn_runner's bundle loop calls
    saved = worker_handlers.STATE_CACHE_SIZE_MB, runner_module[_CONSOLIDATE]
    worker_handlers.STATE_CACHE_SIZE_MB = int(given)
    runner_module[_CONSOLIDATE] = _consolidated_list
    try:
        yield
    finally:
        worker_handlers.STATE_CACHE_SIZE_MB, runner_module[_CONSOLIDATE] = saved


def _run(job: str, pipeline: beam.Pipeline, opts: PipelineOptions) -> RunReport:
    name = runner_name(opts)
    log.info("pipeline %s starting on %s", job, name)
    started = time.perf_counter()
    with _in_process_runner(opts):
        result = pipeline.run()
        result.wait_until_finish()
    report = RunReport(job, name, time.perf_counter() - started, _counters(result))
    log.info("%s", report.line())
    return report


def _assemble_and_write(
    events: Any, out: Outputs, lateness_s: float, q: RunnerQuirks, policy: RewardPolicy
) -> None:
    assembled = events | "AssembleEpisodes" >> AssembleEpisodes(
        lateness_s, q.defer_early_deadlines, q.emit_at_once, policy
    )
    assembled.episodes | "WriteEpisodes" >> WriteEpisodes(
        out.log_url, out.sub("episodes"), EPISODES_TOPIC
    )
    assembled[DEAD_LETTER] | "WriteDeadLetters" >> WriteEpisodes(
        out.log_url, out.sub("deadletter"), DEAD_LETTER_TOPIC
    )


def run_streaming(
    source_url: str,
    out: Outputs,
    beam_args: Sequence[str] = (),
    allowed_lateness_s: float = 600.0,
    stop_when_idle_s: float | None = None,
    records_per_call: int | None = None,
    policy: RewardPolicy = RewardPolicy(),  # frozen: one shared default is safe
    shard: Shard = Shard(),
    judge: JudgeConfig | None = None,
) -> RunReport:
    """Assemble episodes from the event log as events arrive (``records_per_call`` overrides
    the runner's read size, for tests that force many checkpoints and splits; ``policy``: the
    rewards' combination, :mod:`pipeline.rewards`; ``shard``: this job's share of the
    partitions when several jobs read one log, :mod:`pipeline.shards`; ``judge``: score each
    finished rollout through a model server, a reward named ``judge``, :mod:`pipeline.judge`);
    with ``out.run_archive``, the events read are archived there too (:mod:`pipeline.archive`).
    On Kafka its topics are created first: a job started before the first event waits for it."""
    create_topics(source_url, [EVENTS_TOPIC, *([JUDGEMENTS_TOPIC] if judge else [])])
    if out.log_url:
        create_topics(out.log_url, [EPISODES_TOPIC, DEAD_LETTER_TOPIC])
    opts = options(beam_args, streaming=True)
    q = quirks(opts)
    p = beam.Pipeline(options=opts)
    events = p | "ReadEvents" >> ReadEventLog(
        source_url, EVENTS_TOPIC, stop_when_idle_s, records_per_call or q.records_per_call, shard
    )
    if out.run_archive:
        events | "ArchiveEvents" >> ArchiveEvents(out.run_archive)
    if judge is not None:
        events | "Judge" >> JudgeRollouts(judge, source_url)
    _assemble_and_write(events, out, allowed_lateness_s, q, policy)
    worker = f", worker {shard}" if shard.count > 1 else ""
    return _run(f"run (streaming{worker})", p, opts)


def run_replay(
    archive: str,
    out: Outputs,
    beam_args: Sequence[str] = (),
    allowed_lateness_s: float = 600.0,
    policy: RewardPolicy = RewardPolicy(),
) -> RunReport:
    """Rebuild every episode from a Parquet archive of events (batch)."""
    opts = options(beam_args, streaming=False)
    p = beam.Pipeline(options=opts)
    events = p | "ReadArchive" >> ReadArchive(archive)
    _assemble_and_write(events, out, allowed_lateness_s, quirks(opts), policy)
    return _run("replay (batch)", p, opts)
