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

import json
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import paths
from infra.harnesses import Agent, Harness, harness
from infra.local.process import ServiceProcess
from infra.local.vllm import VLLMServer
from infra.sandbox import ProxyEndpoint
from infra.tasks import Task, load_dataset
from openforge.stack import SANDBOX_PROXY_PORT, proxy_process
from openforge.train.config import TrainConfig
from openforge.train.driver import EvalLog, Pacing, RolloutDriver
from openforge.train.warmstart import warm_start
from orchestrator.backend import RunProxy
from orchestrator.registry import RolloutBackendConfig, build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status
from schemas.errors import ConfigError, ServiceError

POLICY = "policy"  # the model name harnesses ask for


@dataclass
class Live:
    """What the progress display shows, updated by the trainer's callback."""

    step: int = 0
    policy_version: int = 0
    train_reward: float | None = None
    step_times: list[float] | None = None
    started: float = 0.0
    last_step_at: float = 0.0


def _harness(cfg: TrainConfig) -> Harness:
    if cfg.harness.name == "agent":
        return Agent(max_turns=cfg.harness.max_turns, max_tokens=cfg.harness.max_tokens)
    return harness(cfg.harness.name)


def _base_model(cfg: TrainConfig) -> Path:
    if cfg.model.base == "tiny":
        from infra.tiny_model import TinyModelSpec, build_tiny_model

        spec = TinyModelSpec(max_position_embeddings=max(cfg.model.context, 4096))
        return build_tiny_model(
            paths.default_tiny_dir(cfg.model.seed, spec.max_position_embeddings),
            cfg.model.seed,
            spec,
        )
    base = Path(cfg.model.base)
    if not (base / "config.json").exists():
        raise ConfigError(
            f"model.base = {cfg.model.base!r} is neither 'tiny' nor a model directory"
        )
    return base


def prepare_model(cfg: TrainConfig, say: Callable[[str], None] = print) -> Path:
    """The model RL starts from: the base (built if it is the tiny one), warm-started per
    ``[warm_start]`` (cached under the cache dir)."""
    return warm_start(
        _base_model(cfg), cfg.warm_start, cfg.harness, paths.cache_dir() / "models", say
    )


def _split(dataset: str, split: str) -> list[Task]:
    return list(load_dataset(Path(dataset), split=split))


class TrainingRun:
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

    # -- set-up ---------------------------------------------------------------------------

    def _launch_tag(self) -> str:
        """A fresh tag per launch of this run directory: rollout ids never repeat on resume."""
        path = self.root / "launches"
        n = int(path.read_text()) + 1 if path.exists() else 1
        path.write_text(str(n))
        return f"l{n}"

    def _initial_weights(self, model_dir: Path, version_dir: Path) -> tuple[Path, int, int]:
        """(weights to serve, policy version, last update done): the latest checkpoint's
        export, or the untrained policy (for LoRA, B = 0: exactly the warm-started model)."""
        from trainer import checkpoint

        state = checkpoint.latest_state(self.root / "trainer" / "checkpoints")
        if state is not None:
            export = self.root / "trainer" / "export" / f"v{state.step}"
            if export.exists():
                return export, state.policy_version, state.step
        if self.cfg.trainer.lora_rank == 0:
            return model_dir, 0, 0
        from trainer.backends import make_backend

        backend = make_backend(
            self.cfg.trainer.backend,
            model_dir,
            self.cfg.trainer.lora_rank,
            1e-3,
            self.cfg.trainer.seed,
        )
        return backend.export_for_inference(version_dir), 0, 0

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.toml").write_text(cfg.to_toml())
        train_tasks = _split(cfg.tasks.dataset, cfg.tasks.train_split)
        heldout = _split(cfg.tasks.dataset, cfg.tasks.heldout_split)
        if not train_tasks:
            raise ConfigError(f"no {cfg.tasks.train_split!r} tasks in {cfg.tasks.dataset}")
        chosen = _harness(cfg)
        model_dir = prepare_model(cfg, self.say)
        tag = self.tag = self._launch_tag()
        log_url = cfg.event_log.url or f"local:{self.root / 'log'}"
        lora = cfg.trainer.lora_rank > 0
        with ExitStack() as stack:
            weights, version, done_steps = self._initial_weights(
                model_dir, self.root / "trainer" / "export" / "v0"
            )
            self.live.step, self.live.policy_version = done_steps, version
            if done_steps:
                self.say(f"resuming after update {done_steps} (policy version {version})")
            self.say(f"starting vLLM on {model_dir} (20-40 s on CPU)")
            vllm = stack.enter_context(
                VLLMServer(
                    model_dir if lora else weights,
                    served_model_name=None if lora else POLICY,
                    max_model_len=cfg.model.context,
                    enable_lora=lora,
                    max_lora_rank=max(cfg.trainer.lora_rank, 8),
                    log_path=self.root / "services" / "vllm.log",
                )
            )
            from trainer.weight_sync import SyncMode, WeightSync

            mode = SyncMode.LORA if lora else SyncMode.FULL
            socket = self.root / "services" / "proxy.sock"
            proxy_args = [
                "--max-model-len", str(cfg.model.context),
                "--max-tokens-cap", str(cfg.proxy.max_tokens_cap),
                "--workers", str(cfg.proxy.workers),  # >1: each sandbox gets its worker's socket
                *cfg.proxy.extra_args,
            ]  # fmt: skip
            admin = stack.enter_context(
                proxy_process(
                    vllm.base_url,
                    model=POLICY,
                    tokenizer=model_dir,
                    log_url=log_url,
                    out=self.root / "services",
                    extra_args=proxy_args,
                    unix_socket=socket,
                )
            )
            sync = WeightSync(vllm.base_url, POLICY, admin.url, admin.token, mode=mode)
            if lora:
                sync.swap(weights, version)
            else:
                admin.set_policy_version(version)
            self.say(f"proxy at {admin.url}; events in {log_url}")
            pipeline_argv = [
                sys.executable, "-m", "openforge", "pipeline", "run", "--source", log_url,
                "--run-archive", str(self.root / "archive"),
                "--lateness", str(cfg.pipeline.lateness_s),
                *[f"--beam-arg={a}" for a in cfg.pipeline.beam_args],
            ]  # fmt: skip
            pipeline = ServiceProcess("pipeline", pipeline_argv, self.root / "pipeline.log")
            pipeline.start()
            stack.callback(pipeline.stop)
            run_proxy = RunProxy(admin.url, ProxyEndpoint(socket, SANDBOX_PROXY_PORT))
            backend = build_backend(RolloutBackendConfig(name=cfg.rollouts.backend), run_proxy)
            stack.callback(backend.close)
            orch_cfg = OrchestratorConfig(
                concurrency=cfg.rollouts.concurrency,
                max_attempts=cfg.rollouts.max_attempts,
                model=POLICY,
            )
            self.train_orch = Orchestrator(
                backend, chosen, admin, RunDir(self.root / "rollouts"), orch_cfg
            )
            self.eval_orch = Orchestrator(
                backend, chosen, admin, RunDir(self.root / "eval"), orch_cfg
            )
            for note, n in _collapse(self.train_orch.check([*train_tasks, *heldout])):
                self.say(f"note ({n} tasks): {note}" if n > 1 else f"note: {note}")
            per_step = min(cfg.tasks.per_step, len(train_tasks))
            self.driver = RolloutDriver(
                admin,
                self.train_orch,
                self.eval_orch,
                train_tasks,
                heldout,
                Pacing(
                    cfg.trainer.steps,
                    per_step,
                    cfg.rollouts.samples_per_task,
                    cfg.trainer.max_staleness,
                    cfg.evaluation.every,
                    cfg.evaluation.samples_per_task,
                    cfg.trainer.seed,
                ),
                self.evals,
                done_steps + 1,
                tag,
                self.stop,
            )
            stack.callback(self._stop_driver)
            watchdog = threading.Thread(
                target=self._watch, args=([vllm, pipeline],), daemon=True, name="watchdog"
            )
            self.live.started = self.live.last_step_at = time.monotonic()
            self.driver.start()
            watchdog.start()
            summary = self._train(model_dir, log_url, sync, per_step, train_tasks)
            self.driver.join()
            if self.failure is not None:
                raise self.failure
            if self.driver.error is None:
                self._drain(log_url, cfg.pipeline.lateness_s + 30.0)
            if self.driver.error is not None:
                raise self.driver.error
            summary["seconds"] = time.monotonic() - self.live.started
            return summary

    def _drain(self, log_url: str, timeout: float) -> None:
        """Before the pipeline stops: wait until every rollout this launch verified has its
        episode (the last evaluation's finish moments before the trainer's end)."""
        from infra.eventlog import EPISODES_TOPIC, open_reader
        from schemas.codec import decode_message
        from schemas.episode import Episode

        wanted = {
            outcome.rollout_id
            for sub in ("rollouts", "eval")
            for outcome in RunDir(self.root / sub).outcomes(prefix=f"{self.tag}-")
            if outcome.status is Status.VERIFIED
        }
        deadline = time.monotonic() + timeout
        with open_reader(log_url, [EPISODES_TOPIC], f"openforge-train-drain-{self.tag}") as reader:
            while wanted and time.monotonic() < deadline:
                for rec in reader.poll(10_000, 1.0):
                    for e in decode_message(rec.value):
                        if isinstance(e, Episode):
                            wanted.discard(e.rollout_id)
        if wanted:
            self.say(f"[yellow]{len(wanted)} rollouts had no episode yet when the run ended[/]")

    def _watch(self, services: list[Any]) -> None:
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

    def _train(
        self,
        model_dir: Path,
        log_url: str,
        sync: Any,
        per_step: int,
        train_tasks: list[Task],
    ) -> dict[str, Any]:
        from trainer.algorithms import AlgorithmConfig
        from trainer.loop import TrainerConfig, train
        from trainer.stream import StreamConfig

        cfg = self.cfg
        return train(
            TrainerConfig(
                episodes=log_url,
                model_dir=model_dir,
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
                    groups_per_batch=per_step,
                    task_ids=frozenset(t.id for t in train_tasks),
                ),
                steps=cfg.trainer.steps,
                idle_timeout=None,
                sync=sync,
                on_step=self._on_step,
                stop=self.stop,
                archive=self.root / "archive",
            )
        )


def _collapse(notes: list[str]) -> list[tuple[str, int]]:
    """Notes that differ only in the task they start with ("task-id: ..."), counted once."""
    counts: dict[str, int] = {}
    for note in notes:
        _, sep, rest = note.partition(": ")
        key = rest if sep else note
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


def write_summary(root: Path, summary: dict[str, Any]) -> None:
    (root / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
