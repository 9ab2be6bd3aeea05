"""``openforge train``: one RL run through every real part, from one config.

What it starts, in order (each stopped on exit, Ctrl-C or SIGTERM, in reverse):

1. the warm start (cached) and vLLM serving it, the policy as LoRA adapter ``policy`` (or, with
   ``trainer.lora_rank = 0``, as full weights reloaded in place);
2. the capture proxy on the event log (the embedded local log under the run directory by
   default, or ``kafka://``), with a Unix socket the sandboxes reach it through;
3. the streaming Beam pipeline, writing episodes to the log, and the events it reads, the
   episodes and the dead letters to the run's Parquet archive;
4. the rollout driver: the orchestrator plays the training tasks with the harness in sandboxes,
   paced to the trainer (``driver.py``), and the held-out split every few versions;
5. the trainer (in this thread): updates from finished episodes, new weights to vLLM, the
   proxy's policy version bumped.

Rerunning with the same run directory resumes from the trainer's last checkpoint: vLLM serves
that checkpoint's weights at its policy version and the driver continues with the next update.

Run directory: ``config.toml`` (resolved), ``services/`` (vLLM and proxy logs, the proxy's spool),
``log/`` (the event log), ``archive/`` (the Parquet archive: completion, rollout and reward
events, episodes and dead letters, and the trainer's step lineage), ``pipeline.log``,
``rollouts/`` and ``eval/`` (one directory per rollout), ``trainer/`` (metrics.csv, TensorBoard,
checkpoints, exported weights), ``eval.csv``, ``curves.png``, ``summary.json``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from infra.engine_meter import EngineMeter
from infra.harnesses.browser import Observation
from infra.images import ImagePolicy
from infra.local.vllm import VLLMServer
from openforge.stack import (
    ModelServer,
    ProxyOptions,
    Stack,
    StackSpec,
    StreamingPipeline,
    pipeline_process,
    serve,
)
from openforge.train.cluster import RolloutCluster, rollout_cluster
from openforge.train.config import POLICY, TrainConfig
from openforge.train.drain import drain
from openforge.train.driver import EvalLog, Pacing, RolloutDriver
from openforge.train.launch import Launch, prepare_launch
from openforge.train.report import (
    Live,
    Report,
    dataset_name,
    previous_seconds,
    write_engine_totals,
    write_report,
)
from orchestrator.backend import RunProxy
from orchestrator.local import LocalConfig
from orchestrator.registry import RolloutBackendConfig, build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status
from schemas.errors import ServiceError
from trainer.weight_sync import SyncMode, WeightSync

if TYPE_CHECKING:  # the trainer's loop imports torch: only the trainer step needs it
    from trainer.loop import TrainerConfig


class Watched(Protocol):
    """A started service: ``check_alive`` raises :class:`ServiceError` once it has died."""

    def check_alive(self) -> None: ...


def stack_spec(cfg: TrainConfig, root: Path, launch: Launch, host: str = "127.0.0.1") -> StackSpec:
    """The run's vLLM and proxy (listening on ``host``): the policy as the LoRA adapter
    ``policy`` on the warm-started model, or (``trainer.lora_rank = 0``) as full weights served
    under that name."""
    lora = cfg.trainer.lora_rank > 0
    # Every screenshot stays in the browser agent's history: one per turn, and the first page.
    images = cfg.harness.max_turns + 1 if cfg.harness.observation is not Observation.TEXT else 0
    served = (
        ModelServer(
            launch.model_dir, None, cfg.model.context, max(cfg.trainer.lora_rank, 8), images
        )
        if lora
        else ModelServer(launch.weights, POLICY, cfg.model.context, None, images)
    )
    return StackSpec(
        out=root / "services",
        log_url=launch.log_url,
        model=POLICY,
        tokenizer=launch.model_dir,
        vllm=served,
        proxy=ProxyOptions(
            max_model_len=cfg.model.context,
            max_tokens_cap=cfg.proxy.max_tokens_cap,
            workers=cfg.proxy.workers,  # >1: each sandbox gets its worker's socket
            host=host,
            faults=cfg.faults.plan(),
        ),
        proxy_args=(*cfg.proxy.extra_args, "--image-dir", str(launch.images)),
    )


def pipeline_job(cfg: TrainConfig, root: Path, log_url: str) -> StreamingPipeline:
    """The run's streaming pipeline: episodes to the run's log, everything to its archive."""
    return StreamingPipeline(
        log_url, root / "archive", cfg.pipeline.lateness_s, tuple(cfg.pipeline.beam_args),
        cfg.pipeline.reward_policy(),
    )  # fmt: skip


def pacing(cfg: TrainConfig, per_step: int) -> Pacing:
    """How the driver paces rollouts to the trainer, and when it evaluates."""
    return Pacing(
        cfg.trainer.steps,
        per_step,
        cfg.rollouts.samples_per_task,
        cfg.trainer.max_staleness,
        cfg.evaluation.every,
        cfg.evaluation.samples_per_task,
        cfg.trainer.seed,
    )


def _per_step(cfg: TrainConfig, launch: Launch) -> int:
    return min(cfg.tasks.per_step, len(launch.train_tasks))


class TrainingRun:
    """One launch of a training run, as its steps (:meth:`run`)."""

    def __init__(
        self,
        cfg: TrainConfig,
        say: Callable[[str], None] = print,
        on_update: Callable[[], None] | None = None,
    ) -> None:
        self.cfg, self.say, self.on_update = cfg, say, on_update
        self.root = Path(cfg.run.output_dir).resolve()
        self.live = Live()
        self.stop = threading.Event()
        self.train_orch: Orchestrator | None = None
        self.eval_orch: Orchestrator | None = None
        self.evals = EvalLog(self.root / "eval.csv")
        self.driver: RolloutDriver | None = None
        self.failure: ServiceError | None = None
        self.tag = ""

    def _set_up(self) -> Launch:
        """The run directory and what this launch starts from (``launch.py``)."""
        launch = prepare_launch(self.cfg, self.root, self.say)
        self.tag = launch.tag
        self.live.step, self.live.policy_version = launch.done_steps, launch.version
        return launch

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> Report:
        """Start the stack, the pipeline and the rollout driver, train in this thread, then
        write the report; everything started is stopped on the way out, in reverse."""
        launch = self._set_up()
        if self._nothing_left(launch):
            return self._report_again()
        with ExitStack() as stack:
            cluster = stack.enter_context(rollout_cluster(self.cfg, self.root, self.say))
            services, vllm, sync = self._start_stack(stack, launch, cluster)
            job = pipeline_job(self.cfg, self.root, launch.log_url)
            pipeline = stack.enter_context(pipeline_process(job, self.root / "pipeline.log"))
            # Before the driver: its first calls are counted in engine.json too.
            engine = stack.enter_context(EngineMeter(vllm.base_url))
            self._start_driver(stack, launch, services, cluster)
            self._start_watchdog([vllm, pipeline])
            self._train(launch, sync, engine)
            seconds = self._finish(launch)
            write_engine_totals(self.root, engine.since_start())
        return write_report(self.root, self.evals.rows, self._title(), seconds)

    def _nothing_left(self, launch: Launch) -> bool:
        """A rerun of a finished run: every update made and the last policy evaluated."""
        trained = launch.done_steps >= self.cfg.trainer.steps
        return trained and (not launch.heldout or self.evals.done(launch.version))

    def _report_again(self) -> Report:
        """The finished run's report, written again from its records; nothing is started."""
        self.say(
            f"nothing left to do: all {self.cfg.trainer.steps} updates were made and their "
            "last policy evaluated; raise trainer.steps to train on"
        )
        return write_report(self.root, self.evals.rows, self._title(), previous_seconds(self.root))

    def _title(self) -> str:
        return f"{dataset_name(self.cfg.tasks.dataset)} ({self.cfg.harness.name})"

    def _start_stack(
        self, stack: ExitStack, launch: Launch, cluster: RolloutCluster | None
    ) -> tuple[Stack, VLLMServer, WeightSync]:
        """vLLM and the proxy (listening where the cluster's pods reach it, if any), serving
        the launch's first weights as its policy version; the weight sync that hands the
        trainer's next ones over."""
        host = cluster.proxy_host if cluster is not None else "127.0.0.1"
        spec = stack_spec(self.cfg, self.root, launch, host)
        services = stack.enter_context(serve(spec, self.say))
        vllm = services.vllm
        assert vllm is not None  # stack_spec always asks for one
        lora = self.cfg.trainer.lora_rank > 0
        admin = services.admin
        mode = SyncMode.LORA if lora else SyncMode.FULL
        sync = WeightSync(vllm.base_url, POLICY, admin.url, admin.token, mode=mode)
        if lora:
            sync.swap(launch.weights, launch.version)
        else:
            admin.set_policy_version(launch.version)
        return services, vllm, sync

    def _orchestrators(
        self, stack: ExitStack, launch: Launch, services: Stack, cluster: RolloutCluster | None
    ) -> None:
        """The rollout backend and the train and eval orchestrators; the tasks checked."""
        cfg = self.cfg
        run_proxy = RunProxy(services.admin.url, services.endpoint)
        config = _backend_config(cfg, cluster, services.admin.url, self.root / "warm")
        backend = build_backend(config, run_proxy)
        stack.callback(backend.close)
        orch_cfg = OrchestratorConfig(
            concurrency=cfg.rollouts.concurrency,
            max_attempts=cfg.rollouts.max_attempts,
            model=POLICY,
            faults=cfg.faults.plan(),
        )
        chosen, admin = launch.harness, services.admin
        self.train_orch = Orchestrator(
            backend, chosen, admin, RunDir(self.root / "rollouts"), orch_cfg
        )
        self.eval_orch = Orchestrator(backend, chosen, admin, RunDir(self.root / "eval"), orch_cfg)
        train_tasks, heldout = launch.train_tasks, launch.heldout
        for note, n in _collapse(self.train_orch.check([*train_tasks, *heldout])):
            self.say(f"note ({n} tasks): {note}" if n > 1 else f"note: {note}")

    def _start_driver(
        self, stack: ExitStack, launch: Launch, services: Stack, cluster: RolloutCluster | None
    ) -> None:
        """The rollout driver, paced to the trainer, from the update after the last one made."""
        self._orchestrators(stack, launch, services, cluster)
        assert self.train_orch is not None and self.eval_orch is not None
        self.driver = RolloutDriver(
            services.admin,
            self.train_orch,
            self.eval_orch,
            launch.train_tasks,
            launch.heldout,
            pacing(self.cfg, _per_step(self.cfg, launch)),
            self.evals,
            launch.done_steps + 1,
            launch.tag,
            self.stop,
        )
        stack.callback(self._stop_driver)
        self.live.started = self.live.last_step_at = time.monotonic()
        self.driver.start()

    def _start_watchdog(self, services: list[Watched]) -> None:
        threading.Thread(target=self._watch, args=(services,), daemon=True, name="watchdog").start()

    def _train(self, launch: Launch, sync: WeightSync, engine: EngineMeter) -> None:
        """The trainer, in this thread, until its last update (or a stop)."""
        from trainer.loop import train

        train(self.trainer_config(launch, sync, engine))

    def trainer_config(
        self, launch: Launch, sync: WeightSync, engine: EngineMeter | None = None
    ) -> TrainerConfig:
        """The trainer's config: the run's episodes, its training tasks, groups of the driver's
        rounds, the weights handed to vLLM after every update, and how busy vLLM was."""
        from trainer.algorithms import AlgorithmConfig
        from trainer.loop import TrainerConfig
        from trainer.stream import StreamConfig

        cfg = self.cfg
        return TrainerConfig(
            episodes=launch.log_url,
            model_dir=launch.model_dir,
            out_dir=self.root / "trainer",
            lora_rank=cfg.trainer.lora_rank or None,
            backend=cfg.trainer.backend,
            lr=cfg.trainer.lr,
            seed=cfg.trainer.seed,
            algo=AlgorithmConfig(
                advantage=cfg.trainer.advantage, policy_loss=cfg.trainer.policy_loss
            ),
            stream=StreamConfig(
                group_size=cfg.rollouts.samples_per_task,
                token_budget=10_000_000,
                max_staleness=cfg.trainer.max_staleness,
                stale=cfg.trainer.stale,
                groups_per_batch=_per_step(cfg, launch),
                task_ids=frozenset(t.id for t in launch.train_tasks),
            ),
            steps=cfg.trainer.steps,
            idle_timeout=None,
            sync=sync,
            on_step=self._on_step,
            stop=self.stop,
            archive=self.root / "archive",
            engine=engine,
            image_dir=launch.images,
        )

    def _finish(self, launch: Launch) -> float:
        """Wait for the driver's last evaluation and the last episodes; the run's seconds. A
        dead service's or the driver's error is raised here."""
        assert self.driver is not None
        self.driver.join()
        if self.failure is not None:
            raise self.failure
        if self.driver.error is None:
            self._drain(launch.log_url, self.cfg.pipeline.lateness_s + 30.0)
        if self.driver.error is not None:
            raise self.driver.error
        return time.monotonic() - self.live.started

    def _drain(self, log_url: str, timeout: float) -> None:
        """Before the pipeline stops: every rollout this launch verified has its episode, and
        every event is archived (``openforge.train.drain``)."""
        wanted = {
            outcome.rollout_id
            for job in RunDir.found_in(self.root)
            for outcome in job.outcomes(prefix=f"{self.tag}-")
            if outcome.status is Status.VERIFIED
        }
        group = f"openforge-train-drain-{self.tag}"
        drain(log_url, self.root / "archive", wanted, group, timeout, self.say)

    def _watch(self, services: list[Watched]) -> None:
        """Stop the run (with the service's log tail as the error) when vLLM or the pipeline
        dies: the trainer would otherwise wait for episodes that never come."""
        while not self.stop.wait(1.0):
            for service in services:
                try:
                    service.check_alive()
                except ServiceError as exc:
                    self.failure = exc
                    self._stop_driver()
                    return

    def _stop_driver(self) -> None:
        self.stop.set()
        for orch in (self.train_orch, self.eval_orch):
            if orch is not None:
                orch.cancel()
        if self.driver is not None and self.driver.is_alive():
            self.driver.join(60)

    def _on_step(self, step: int, metrics: dict[str, Any]) -> None:
        now = time.monotonic()
        self.live.step = step
        self.live.policy_version = int(metrics.get("policy/version", self.live.policy_version))
        self.live.train_reward = float(metrics["reward/mean"])
        self.live.step_times = [*(self.live.step_times or []), now - self.live.last_step_at]
        self.live.last_step_at = now
        if self.on_update is not None:
            self.on_update()


def _collapse(notes: list[str]) -> list[tuple[str, int]]:
    """Notes that differ only in the task they start with ("task-id: ..."), counted once."""
    counts: dict[str, int] = {}
    for note in notes:
        _, sep, rest = note.partition(": ")
        key = rest if sep else note
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


def _backend_config(
    cfg: TrainConfig, cluster: RolloutCluster | None, proxy_url: str, warm_dir: Path
) -> RolloutBackendConfig:
    """The rollout backend's section from ``[rollouts]`` (where tasks with an image run, the
    warm pool: one member per rollout slot) and, on Kubernetes, the cluster and the proxy's
    port."""
    r = cfg.rollouts
    images = ImagePolicy(fallbacks=r.image_fallbacks, strict=r.strict_images)
    warm = r.concurrency if r.warm_pool else 0
    local = LocalConfig(sandbox=r.sandbox, images=images, warm_pool=warm, warm_dir=warm_dir)
    if cluster is None:
        return RolloutBackendConfig(name=r.backend, local=local)
    port = urlsplit(proxy_url).port
    assert port is not None  # the proxy's admin URL is http://HOST:PORT
    return RolloutBackendConfig(
        name=r.backend, local=local, kubernetes=cluster.options(port, images)
    )
