"""What a training config asks of each part of its run: the stack (vLLM and the proxy), the
streaming pipeline, the rollout driver's pacing and the rollout backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from urllib.parse import urlsplit

from infra.harnesses.browser import Observation
from infra.images import ImagePolicy
from openforge.stack import ModelServer, ProxyOptions, StackSpec, StreamingPipeline
from openforge.train.cluster import RolloutCluster
from openforge.train.config import POLICY, HeldOutFaults, TrainConfig
from openforge.train.driver import Pacing
from openforge.train.launch import Launch
from orchestrator.local import LocalConfig
from orchestrator.registry import RolloutBackendConfig
from schemas.faults import ROLLOUT_FAULTS, FaultPlan


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


def backend_config(
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


def faulted_heldout(cfg: TrainConfig) -> FaultPlan | None:
    """The plan of the held-out split's faulted evaluation (``faults.heldout = "both"``): each
    sandbox fault of the run in every rollout (None: no such evaluation)."""
    plan = cfg.faults.plan()
    if plan is None or cfg.faults.heldout is HeldOutFaults.CLEAN:
        return None
    kinds = {k: 1.0 for k, rate in plan.rates.items() if k in ROLLOUT_FAULTS and rate > 0}
    return dataclasses.replace(plan, rates=kinds)
