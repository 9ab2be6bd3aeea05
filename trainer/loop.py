"""The training loop, in algorithm order: episodes -> batch -> corrected update -> weights -> log.

summary = train(TrainerConfig(episodes="local:events", model_dir=..., out_dir=...))
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra import failpoints
from infra.engine_meter import EngineMeter
from schemas.episode import Episode
from trainer import checkpoint
from trainer.algorithms import AlgorithmConfig
from trainer.backends import BACKENDS, BackendName, make_backend
from trainer.backends.base import TrainerBackend
from trainer.batch import to_batch
from trainer.lineage import StepArchive, step_record
from trainer.metrics_log import MetricsLog
from trainer.promotion import PromotionGate, PromotionLog
from trainer.ranks import Ranks
from trainer.schedule import Schedule
from trainer.stream import (
    EpisodeSource,
    EpisodeStream,
    Position,
    StreamConfig,
    StreamStats,
    policy_lag,
)
from trainer.weight_sync import WeightSync

logger = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    """Attributes:
    episodes: where finished episodes come from: ``kafka://HOST:PORT``, ``local:DIR`` or
        ``archive:DIR``.
    model_dir: the base model (Hugging Face format).
    out_dir: checkpoints, metrics.csv, tensorboard/, reward_curve.png, consumed.jsonl.
    archive: an archive root (``RUN/archive`` in a training run) that gets one lineage record
        per update (``schemas.step``, ``trainer.lineage``); None: only consumed.jsonl.
    lora_rank: train a LoRA adapter of this rank (None: full weights).
    backend: ``cpu`` (the reference: transformers, peft, AdamW) or ``verl`` (veRL's FSDP engine;
        one process per GPU under torchrun).
    lr: AdamW learning rate.
    algo, stream: veRL algorithm settings; episode admission, grouping and batching.
    steps: stop after this many updates (None: run until idle_timeout).
    idle_timeout: stop after this many seconds without a complete batch (None: never).
    checkpoint_every: updates between checkpoints.
    sync: hand new weights to vLLM (and bump the proxy's policy version) every ``sync_every``
        updates (``trainer.schedule``: what is due after each update, the same on every rank).
    group: consumer group in the event log (the trainer's position survives restarts).
    on_step: called with (step, metrics) after each update (progress displays, schedulers).
    stop: when set, the loop ends after the current update (a checkpoint is written).
    image_dir: the proxy's image store, where a sample's images are read back (a
        vision-language policy on screenshots; None: no sample may have images).
    engine: the serving engine's meter: each update records the fraction of the time since the
        previous one that the engine was busy (``engine/busy_fraction``).
    serve_at_start: with ``sync``, serve the weights the trainer starts from before its first
        update: as version 0 on a fresh start, else as the next version (vLLM may serve newer
        weights than the checkpoint's, or none after its own restart). A trainer in front of
        live traffic needs it: the adapter exists from the start, and after a restart vLLM
        serves what the trainer trains on.
    """

    episodes: str
    model_dir: Path
    out_dir: Path
    lora_rank: int | None = 8
    backend: BackendName = BackendName.CPU
    lr: float = 1e-3
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    steps: int | None = None
    idle_timeout: float | None = 30.0
    checkpoint_every: int = 1
    sync: WeightSync | None = None
    sync_every: int = 1
    group: str = "openforge-trainer"
    seed: int = 0
    on_step: Callable[[int, dict[str, Any]], None] | None = None
    stop: threading.Event | None = None
    archive: Path | None = None
    engine: EngineMeter | None = None
    serve_at_start: bool = False
    gate: PromotionGate | None = None
    image_dir: Path | None = None

    def __post_init__(self) -> None:
        BACKENDS.get(self.backend)  # a typo fails here, listing the valid backends
        self.backend = BackendName(self.backend)
        self.schedule()  # a bad sync_every or checkpoint_every fails here too

    def schedule(self) -> Schedule:
        """When weights are synced and checkpoints written (no sync without ``sync``)."""
        return Schedule(self.sync_every if self.sync is not None else None, self.checkpoint_every)


def train(cfg: TrainerConfig) -> dict[str, Any]:
    """Run the loop; under torchrun every rank calls this and rank 0 leads (``trainer.ranks``)."""
    backend = make_backend(
        cfg.backend, cfg.model_dir, cfg.lora_rank, cfg.lr, cfg.seed, image_dir=cfg.image_dir
    )
    ranks = Ranks.current()
    resumed = checkpoint.load_latest(_checkpoints(cfg), backend)
    state = resumed or checkpoint.TrainerState()
    if resumed is not None and ranks.lead:
        logger.warning(
            "resumed from the checkpoint of step %d (policy version %d, %d episodes trained)",
            resumed.step, resumed.policy_version, len(resumed.seen),
        )  # fmt: skip
    if not ranks.lead:
        return _follow(cfg, backend, ranks, state)
    with _Lead(cfg, backend, ranks, state) as lead:
        lead.run()
    return lead.summary()


class _Lead:
    """Rank 0: reads the stream, updates, hands the weights over, logs, checkpoints, commits."""

    def __init__(
        self,
        cfg: TrainerConfig,
        backend: TrainerBackend,
        ranks: Ranks,
        state: checkpoint.TrainerState,
    ) -> None:
        self.cfg, self.backend, self.ranks, self.state = cfg, backend, ranks, state
        self.schedule = cfg.schedule()
        self.source = EpisodeSource(cfg.episodes, group=cfg.group)
        self.stream = EpisodeStream(self.source, cfg.stream, seen=state.seen)
        self.log = MetricsLog(cfg.out_dir)
        self.versions = checkpoint.PolicyVersions(cfg.out_dir / "versions.jsonl")
        # Resume from the highest version ever handed out (checkpoint.PolicyVersions).
        state.policy_version = max(state.policy_version, self.versions.high_water())
        if cfg.serve_at_start and cfg.sync is not None:
            self._serve_start()
        ranks.broadcast(state.policy_version)  # every rank counts on from the same version
        redone = checkpoint.truncate_ledger(cfg.out_dir / "consumed.jsonl", state.step)
        if redone:
            logger.warning(
                "resuming at step %d: %d updates after it are made again", state.step, redone
            )
        self.consumed = open(cfg.out_dir / "consumed.jsonl", "a")  # noqa: SIM115 - __exit__
        self.lineage = StepArchive(cfg.archive) if cfg.archive is not None else None

    def __enter__(self) -> _Lead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.consumed.close()
        self.log.plot_rewards()
        self.log.close()
        self.source.close()

    def run(self) -> None:
        """Update on each batch until ``steps``, a stop, or idle; then a final checkpoint."""
        last_batch = ready = time.monotonic()
        while self.cfg.steps is None or self.state.step < self.cfg.steps:
            episodes, stop = self._next_batch(last_batch)
            if stop:
                break
            if episodes is None:
                continue
            last_batch = time.monotonic()
            self._step(episodes, waited=last_batch - ready)
            ready = time.monotonic()
        self._checkpoint()
        self.stream.commit()

    def _next_batch(self, last_batch: float) -> tuple[list[Episode] | None, bool]:
        """The next batch (None: none complete yet) and whether to stop, sent to every rank."""
        episodes = self.stream.next_batch(self.state.policy_version, timeout=0.5)
        idle_s = time.monotonic() - last_batch
        idle = self.cfg.idle_timeout is not None and idle_s > self.cfg.idle_timeout
        halt = self.cfg.stop is not None and self.cfg.stop.is_set()
        batch: tuple[list[Episode] | None, bool] = self.ranks.broadcast(
            (episodes, halt or (episodes is None and idle))
        )
        return batch

    def _step(self, episodes: list[Episode], waited: float) -> None:
        """One update, then what the schedule says is due, its records and its callback;
        ``waited``: the seconds since the previous update's end spent waiting for its batch."""
        state = self.state
        positions = [self.stream.position(e.episode_id) for e in episodes]
        self.stream.trained(episodes)
        failpoints.hit("trainer.before_update", state.step + 1)
        t0 = time.perf_counter()
        if episodes:
            metrics = self.backend.train_step(to_batch(episodes), self.cfg.algo)
        else:  # a round whose groups had no signal: the weights stay, the version moves on
            logger.warning("update %d has no trainable episode: skipped", state.step + 1)
            metrics = {"update/skipped": 1.0}
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["time/wait_s"] = waited
        metrics["device/gpu"] = 1.0 if self.backend.device.startswith("cuda") else 0.0
        state.step += 1
        metrics.update(_batch_metrics(episodes, state.policy_version, self.stream.stats))
        due = self.schedule.after(state.step, state.policy_version)
        if due.sync:
            metrics.update(self._sync_or_hold(due.version))
        metrics["policy/version"] = state.policy_version
        if self.cfg.engine is not None and (busy := self.cfg.engine.take()) is not None:
            metrics["engine/busy_fraction"] = busy
        self._record(episodes, positions, metrics)
        if due.checkpoint:
            self._checkpoint()
            failpoints.hit("trainer.after_checkpoint", state.step)
            self.stream.commit()

    def _serve_start(self) -> None:
        """Serve the weights this trainer starts from (``TrainerConfig.serve_at_start``)."""
        assert self.cfg.sync is not None
        self.cfg.sync.wait_for_vllm()  # deployed beside it, the trainer may start first
        if self.state.step == 0 and self.versions.high_water() == 0:  # nothing served yet
            exported = self.backend.export_for_inference(_export_dir(self.cfg, self.state))
            self.cfg.sync.swap(exported, 0)
        else:
            self._sync(self.state.policy_version + 1)
        logger.info("serving the starting weights as policy version %d", self.state.policy_version)

    def _sync_or_hold(self, version: int) -> dict[str, float]:
        """Export the weights and serve them as ``version``, if the gate (when set) promotes
        them; every rank learns the version served (``_follow``). Metrics of the sync."""
        exported = self.backend.export_for_inference(_export_dir(self.cfg, self.state))
        out: dict[str, float] = {}
        gate = self.cfg.gate
        served = self.state.policy_version
        check = None if gate is None else gate.check(exported, served, version)
        if check is not None:
            PromotionLog(self.cfg.out_dir / "promotions.jsonl").write(
                self.state.step, version, served, check
            )
            out.update(check.metrics())
        if check is None or check.promoted:
            out["sync/seconds"] = self._swap(exported, version)
        else:
            logger.warning(
                "candidate of step %d held: its held-out score %.3f is below the served policy "
                "%d's %.3f by more than %g; version %d stays served",
                self.state.step, check.candidate_score, served, check.served_score,
                check.max_regression, served,
            )  # fmt: skip
        self.ranks.broadcast(self.state.policy_version)
        return out

    def _sync(self, version: int) -> float:
        """Export the weights and serve them as ``version``; the seconds taken."""
        exported = self.backend.export_for_inference(_export_dir(self.cfg, self.state))
        return self._swap(exported, version)

    def _swap(self, exported: Path, version: int) -> float:
        """Serve ``exported`` as ``version`` (recorded first); the seconds taken."""
        assert self.cfg.sync is not None  # the schedule syncs only with a WeightSync
        self.versions.record(self.state.step, version)
        self.state.policy_version = version
        seconds = self.cfg.sync.swap(exported, version)
        failpoints.hit("trainer.after_swap", self.state.step)
        return seconds

    def _record(
        self, episodes: list[Episode], positions: list[Position | None], metrics: dict[str, Any]
    ) -> None:
        """The update in the consumed ledger, the lineage, the metrics log and the callback."""
        step, version = self.state.step, self.state.policy_version
        entry = {"step": step, "episodes": [e.episode_id for e in episodes]}
        self.consumed.write(json.dumps(entry) + "\n")
        self.consumed.flush()
        if self.lineage is not None:
            self.lineage.write(step_record(step, version, episodes, positions, metrics))
        self.log.log(step, metrics)
        if self.cfg.on_step is not None:
            self.cfg.on_step(step, metrics)

    def _checkpoint(self) -> None:
        self.state.seen = self.stream.done_ids()
        checkpoint.save(_checkpoints(self.cfg), self.backend, self.state, self.ranks)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.state.step,
            "policy_version": self.state.policy_version,
            "stats": self.stream.stats,
            "out_dir": str(self.cfg.out_dir),
        }


def _batch_metrics(
    episodes: list[Episode], version: int, stats: StreamStats
) -> dict[str, float | int]:
    """Reward, staleness (against the ``version`` trained) and the stream's counts."""
    rewards = [float(e.reward or 0.0) for e in episodes]
    lags = [policy_lag(e, version) for e in episodes] or [0]
    return {
        "reward/mean": sum(rewards) / len(rewards) if rewards else float("nan"),
        "staleness/mean": sum(lags) / len(lags),
        "staleness/max": max(lags),
        "stream/duplicates": stats.duplicates,
        "stream/dead_letters": stats.dead_letters,
        "stream/stale_dropped": stats.stale_dropped,
        "stream/stale_kept": stats.stale_kept,
        "stream/not_trained_task": stats.not_trained_task,
        "stream/partial_groups": stats.partial_groups,
        "stream/timed_out_alone": stats.timed_out_alone,
        "stream/lost_members": stats.lost_members,
        "stream/short_alone": stats.short_alone,
        "stream/empty_groups": stats.empty_groups,
        "stream/superseded": stats.superseded,
        "data/episodes": len(episodes),
    }


def _checkpoints(cfg: TrainerConfig) -> Path:
    return cfg.out_dir / "checkpoints"


def _export_dir(cfg: TrainerConfig, state: checkpoint.TrainerState) -> Path:
    """Where the weights after step N are exported: ``export/vN``. A re-export (a run resumed
    from an earlier checkpoint) goes beside it (``vN-r1``, ...), never over files vLLM may be
    reading: an adapter half rewritten under a registered name brings its engine down. Only
    the lead rank writes, so the other ranks' choice does not matter."""
    base = cfg.out_dir / "export" / f"v{state.step}"
    path, again = base, 0
    while path.exists():
        again += 1
        path = base.with_name(f"{base.name}-r{again}")
    return path


def _follow(
    cfg: TrainerConfig, backend: TrainerBackend, ranks: Ranks, state: checkpoint.TrainerState
) -> dict[str, Any]:
    """A non-lead rank: take each batch from the lead and join the collective steps."""
    schedule = cfg.schedule()
    if cfg.serve_at_start and cfg.sync is not None:  # the lead's _serve_start, collectively
        backend.export_for_inference(_export_dir(cfg, state))
    state.policy_version = ranks.broadcast(None)  # the lead's, resumed (see _Lead)
    while cfg.steps is None or state.step < cfg.steps:
        episodes, stop = ranks.broadcast(None)
        if stop:
            break
        if episodes is None:
            continue
        if episodes:  # an empty batch is a skipped update, as on the lead
            backend.train_step(to_batch(episodes), cfg.algo)
        state.step += 1
        due = schedule.after(state.step, state.policy_version)
        if due.sync:  # the lead's _sync_or_hold: the export, then the version it serves
            backend.export_for_inference(_export_dir(cfg, state))
            state.policy_version = ranks.broadcast(None)
        if due.checkpoint:
            checkpoint.save(_checkpoints(cfg), backend, state, ranks)
    checkpoint.save(_checkpoints(cfg), backend, state, ranks)
    return {"steps": state.step, "policy_version": state.policy_version, "rank": ranks.rank}
