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
from trainer import checkpoint
from trainer.algorithms import AlgorithmConfig
from trainer.backends import BACKENDS, BackendName, make_backend
from trainer.backends.base import TrainerBackend
from trainer.batch import to_batch
from trainer.lineage import StepArchive, step_record
from trainer.metrics_log import MetricsLog
from trainer.ranks import Ranks
from trainer.stream import EpisodeSource, EpisodeStream, StreamConfig, policy_lag
from trainer.weight_sync import WeightSync

logger = logging.getLogger("openforge.trainer")


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
    sync: hand new weights to vLLM (and bump the proxy's policy version) every ``sync_every``.
    group: consumer group in the event log (the trainer's position survives restarts).
    on_step: called with (step, metrics) after each update (progress displays, schedulers).
    stop: when set, the loop ends after the current update (a checkpoint is written).
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

    def __post_init__(self) -> None:
        BACKENDS.get(self.backend)  # a typo fails here, listing the valid backends
        self.backend = BackendName(self.backend)


def train(cfg: TrainerConfig) -> dict[str, Any]:
    """Run the loop; under torchrun every rank calls this and rank 0 leads (``trainer.ranks``)."""
    backend = make_backend(cfg.backend, cfg.model_dir, cfg.lora_rank, cfg.lr, cfg.seed)
    ranks = Ranks.current()
    ckpt_dir = cfg.out_dir / "checkpoints"
    state = checkpoint.load_latest(ckpt_dir, backend) or checkpoint.TrainerState()
    if not ranks.lead:
        return _follow(cfg, backend, ranks, state)
    source = EpisodeSource(cfg.episodes, group=cfg.group)
    stream = EpisodeStream(source, cfg.stream, seen=state.seen)
    log = MetricsLog(cfg.out_dir)
    versions = checkpoint.PolicyVersions(cfg.out_dir / "versions.jsonl")
    state.policy_version = max(state.policy_version, versions.high_water())
    redone = checkpoint.truncate_ledger(cfg.out_dir / "consumed.jsonl", state.step)
    if redone:
        logger.warning(
            "resuming at step %d: %d updates after it are made again", state.step, redone
        )
    consumed = open(cfg.out_dir / "consumed.jsonl", "a")  # noqa: SIM115 - closed below
    lineage = StepArchive(cfg.archive) if cfg.archive is not None else None
    last_batch = time.monotonic()
    try:
        while cfg.steps is None or state.step < cfg.steps:
            episodes = stream.next_batch(state.policy_version, timeout=0.5)
            idle = cfg.idle_timeout is not None and time.monotonic() - last_batch > cfg.idle_timeout
            halt = cfg.stop is not None and cfg.stop.is_set()
            episodes, stop = ranks.broadcast((episodes, halt or (episodes is None and idle)))
            if stop:
                break
            if episodes is None:
                continue
            last_batch = time.monotonic()
            positions = [stream.position(e.episode_id) for e in episodes]
            stream.trained(episodes)
            failpoints.hit("trainer.before_update", state.step + 1)
            t0 = time.perf_counter()
            metrics = backend.train_step(to_batch(episodes), cfg.algo)
            metrics["time/step_s"] = time.perf_counter() - t0
            state.step += 1
            rewards = [float(e.reward or 0.0) for e in episodes]
            lags = [policy_lag(e, state.policy_version) for e in episodes]
            metrics.update(
                {
                    "reward/mean": sum(rewards) / len(rewards),
                    "staleness/mean": sum(lags) / len(lags),
                    "staleness/max": max(lags),
                    "stream/duplicates": stream.stats.duplicates,
                    "stream/dead_letters": stream.stats.dead_letters,
                    "stream/stale_dropped": stream.stats.stale_dropped,
                    "stream/stale_kept": stream.stats.stale_kept,
                    "stream/not_trained_task": stream.stats.not_trained_task,
                    "stream/partial_groups": stream.stats.partial_groups,
                    "stream/timed_out_alone": stream.stats.timed_out_alone,
                    "data/episodes": len(episodes),
                }
            )
            if cfg.sync is not None and state.step % cfg.sync_every == 0:
                exported = backend.export_for_inference(_export_dir(cfg, state))
                state.policy_version = versions.reserve(state.step, state.policy_version)
                metrics["sync/seconds"] = cfg.sync.swap(exported, state.policy_version)
                failpoints.hit("trainer.after_swap", state.step)
            metrics["policy/version"] = state.policy_version
            consumed.write(
                json.dumps({"step": state.step, "episodes": [e.episode_id for e in episodes]})
                + "\n"
            )
            consumed.flush()
            if lineage is not None:
                lineage.write(
                    step_record(state.step, state.policy_version, episodes, positions, metrics)
                )
            log.log(state.step, metrics)
            if cfg.on_step is not None:
                cfg.on_step(state.step, metrics)
            if state.step % cfg.checkpoint_every == 0:
                state.seen = stream.done_ids()
                checkpoint.save(ckpt_dir, backend, state, ranks)
                failpoints.hit("trainer.after_checkpoint", state.step)
                stream.commit()
        state.seen = stream.done_ids()
        checkpoint.save(ckpt_dir, backend, state, ranks)
        stream.commit()
    finally:
        consumed.close()
        log.plot_rewards()
        log.close()
        source.close()
    return {
        "steps": state.step,
        "policy_version": state.policy_version,
        "stats": stream.stats,
        "out_dir": str(cfg.out_dir),
    }


def _export_dir(cfg: TrainerConfig, state: checkpoint.TrainerState) -> Path:
    return cfg.out_dir / "export" / f"v{state.step}"


def _follow(
    cfg: TrainerConfig, backend: TrainerBackend, ranks: Ranks, state: checkpoint.TrainerState
) -> dict[str, Any]:
    """A non-lead rank: take each batch from the lead and join the collective steps."""
    while cfg.steps is None or state.step < cfg.steps:
        episodes, stop = ranks.broadcast(None)
        if stop:
            break
        if episodes is None:
            continue
        backend.train_step(to_batch(episodes), cfg.algo)
        state.step += 1
        if cfg.sync is not None and state.step % cfg.sync_every == 0:
            backend.export_for_inference(_export_dir(cfg, state))
            state.policy_version += 1
        if state.step % cfg.checkpoint_every == 0:
            checkpoint.save(cfg.out_dir / "checkpoints", backend, state, ranks)
    checkpoint.save(cfg.out_dir / "checkpoints", backend, state, ranks)
    return {"steps": state.step, "policy_version": state.policy_version, "rank": ranks.rank}
