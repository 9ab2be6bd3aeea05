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
checkpoints, exported weights), ``eval.csv`` (and ``eval-faulted.csv``, ``eval-faulted/``: the
held-out split played with sandbox faults), ``curves.png``, ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from infra.engine_meter import EngineMeter
from infra.local.vllm import VLLMServer
from openforge.stack import (
    Stack,
    pipeline_process,
    serve,
)
from openforge.train.cluster import RolloutCluster, rollout_cluster
from openforge.train.config import POLICY, TrainConfig
from openforge.train.drain import drain
from openforge.train.driver import EvalLog, FaultedEval, RolloutDriver
from openforge.train.launch import Launch, prepare_launch
from openforge.train.report import (
    FAULTED_EVAL,
    Live,
    Report,
    dataset_name,
    previous_seconds,
    write_engine_totals,
    write_report,
)
from openforge.train.specs import (
    backend_config,
    faulted_heldout,
    pacing,
    pipeline_job,
    stack_spec,
)
from orchestrator.backend import RunProxy
from orchestrator.registry import build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status
from schemas.errors import ServiceError
from schemas.faults import FaultPlan
from trainer.weight_sync import SyncMode, WeightSync

if TYPE_CHECKING:  # the trainer's loop imports torch: only the trainer step needs it
    from trainer.loop import TrainerConfig


class Watched(Protocol):
    """A started service: ``check_alive`` raises :class:`ServiceError` once it has died."""

    def check_alive(self) -> None: ...


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
        self.faulted_eval: FaultedEval | None = None
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
        return write_report(self.root, self.evals.rows, self._title(), seconds, self._faults())

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
        seconds = previous_seconds(self.root)
        return write_report(self.root, self.evals.rows, self._title(), seconds, self._faults())

    def _faults(self) -> dict[str, float]:
        return dict(self.cfg.faults.rates)

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
        config = backend_config(cfg, cluster, services.admin.url, self.root / "warm")
        backend = build_backend(config, run_proxy)
        stack.callback(backend.close)
        orch_cfg = OrchestratorConfig(
            concurrency=cfg.rollouts.concurrency,
            max_attempts=cfg.rollouts.max_attempts,
            model=POLICY,
        )
        chosen, admin = launch.harness, services.admin

        def orchestrator(name: str, faults: FaultPlan | None) -> Orchestrator:
            settings = dataclasses.replace(orch_cfg, faults=faults)
            return Orchestrator(backend, chosen, admin, RunDir(self.root / name), settings)

        self.train_orch = orchestrator("rollouts", cfg.faults.plan())
        self.eval_orch = orchestrator("eval", None)  # clean of sandbox faults
        faulted = faulted_heldout(cfg)
        if faulted is not None:  # the held-out split again, every rollout faulted
            log = EvalLog(self.root / FAULTED_EVAL)
            self.faulted_eval = FaultedEval(orchestrator("eval-faulted", faulted), log)
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
            self.faulted_eval,
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
        faulted = self.faulted_eval.orchestrator if self.faulted_eval else None
        for orch in (self.train_orch, self.eval_orch, faulted):
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
