"""The proxy's shared state: settings, rollouts, renderer, upstream, publisher, metrics, and the
gate (pause during a weight swap, concurrency slots) every call passes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from proxy.config import PauseMode, ProxyConfig
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher
from proxy.render import Renderer
from proxy.rollouts import FinishedRollout, Rollout, RolloutRegistry
from proxy.upstream import Upstream
from schemas.enums import RolloutPhase
from schemas.rollout import RolloutEvent


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class ProxyState:
    config: ProxyConfig
    renderer: Renderer
    upstream: Upstream
    publisher: Publisher
    max_model_len: int
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    rollouts: RolloutRegistry = field(init=False)
    in_flight: int = 0
    policy_version: int = 0
    resume: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.rollouts = RolloutRegistry(self.config.finished_rollouts)
        self.policy_version = self.config.policy_version
        self.metrics.policy_version.set(self.policy_version)
        self.resume.set()

    def start_rollout(self, rollout_id: str, *, mint_key: bool, **fields: object) -> Rollout:
        """Register a rollout and publish its ``started`` RolloutEvent."""
        rollout = self.rollouts.create(rollout_id, mint_key=mint_key, **fields)
        self.publisher.publish(
            [
                RolloutEvent(
                    event_id=f"ro_{rollout_id}_started",
                    rollout_id=rollout_id,
                    phase=RolloutPhase.STARTED,
                    at_us=rollout.created_us,
                    task_id=rollout.task_id,
                    group_id=rollout.group_id,
                    harness=rollout.harness,
                    harness_version=rollout.harness_version,
                    backend=str(fields.get("backend") or "") or None,
                    metadata=rollout.metadata,
                )
            ]
        )
        return rollout

    def finish_rollout(
        self,
        rollout: Rollout,
        phase: RolloutPhase,
        *,
        backend: str | None = None,
        exit_code: int | None = None,
        message: str | None = None,
    ) -> FinishedRollout:
        """Publish the rollout's end (a RolloutEvent in ``phase``) and evict it from the live
        rollouts (:meth:`RolloutRegistry.finish`)."""
        at = now_us()
        self.publisher.publish(
            [
                RolloutEvent(
                    event_id=f"ro_{rollout.rollout_id}_{phase.value}",
                    rollout_id=rollout.rollout_id,
                    phase=phase,
                    at_us=at,
                    task_id=rollout.task_id,
                    group_id=rollout.group_id,
                    harness=rollout.harness,
                    harness_version=rollout.harness_version,
                    backend=backend,
                    exit_code=exit_code,
                    duration_s=(at - rollout.created_us) / 1e6,
                    message=message,
                    metadata=rollout.metadata,
                )
            ]
        )
        return self.rollouts.finish(rollout, phase)

    def publish_phase(self, rollout_id: str, phase: RolloutPhase, **fields: object) -> None:
        """Publish a lifecycle phase reported by the orchestrator (no registry change)."""
        self.publisher.publish(
            [
                RolloutEvent(
                    event_id=f"ro_{rollout_id}_{phase.value}",
                    rollout_id=rollout_id,
                    phase=phase,
                    at_us=now_us(),
                    **fields,  # type: ignore[arg-type]
                )
            ]
        )

    async def admit(self) -> None:
        """Wait for (or, in reject mode, refuse with 429 during) a weight swap, then take a
        concurrency slot or refuse with 429. The caller gives the slot back with
        :meth:`release` exactly once (:class:`proxy.lifecycle.CallLifecycle` does)."""
        if not self.resume.is_set():
            if self.config.pause_mode is PauseMode.REJECT:
                raise ProxyError(
                    429,
                    "the policy is being updated; retry shortly",
                    retry_after=str(self.config.pause_retry_after),
                    code="paused",
                )
            await self.resume.wait()
        if self.in_flight >= self.config.max_concurrency:
            self.metrics.errors.labels("concurrency").inc()
            raise ProxyError(
                429,
                f"too many calls in flight ({self.in_flight}); retry shortly",
                retry_after="1",
                code="concurrency_limit",
            )
        self.in_flight += 1
        self.metrics.in_flight.inc()

    def release(self) -> None:
        """Give back the concurrency slot :meth:`admit` took."""
        self.in_flight -= 1
        self.metrics.in_flight.dec()
