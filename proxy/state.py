"""The proxy's shared state: settings, rollouts, renderer, upstream, publisher, metrics, and the
gate (pause during a weight swap, concurrency slots) every call passes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from proxy.config import PauseMode, ProxyConfig
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher, Receipt
from proxy.redaction import Redactor
from proxy.render import Renderer
from proxy.rollouts import FinishedRollout, Rollout, RolloutRegistry
from proxy.upstream import Upstream
from schemas.codec import RolloutRecord
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

log = logging.getLogger("openforge.proxy")


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
    redactor: Redactor = field(init=False)
    in_flight: int = 0
    policy_version: int = 0
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    message_limit: int | None = None  # the event log's largest message (None: no limit)
    auto_resumes: int = 0  # pauses that ended by their timeout
    _pause_timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    _idle: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def __post_init__(self) -> None:
        self.rollouts = RolloutRegistry(self.config.finished_rollouts)
        secrets = [self.config.admin_token] if self.config.patterns else []
        self.redactor = Redactor(self.config.patterns, [s for s in secrets if s])
        self.policy_version = self.config.policy_version
        self.metrics.policy_version.set(self.policy_version)
        self.resume.set()
        self._idle.set()  # set exactly while no call is in flight

    @property
    def body_limit(self) -> int:
        """A call's body limit: ``max_body_bytes``, and at most half the log's message limit
        (the rest is room for the generation and the record's other fields)."""
        limit = self.config.max_body_bytes
        return limit if self.message_limit is None else min(limit, self.message_limit // 2)

    # --- recording ----------------------------------------------------------------------------

    def check_recording(self) -> None:
        """503 while the publisher cannot record in time (dead, stalled, or behind)."""
        problem = self.publisher.problem()
        if problem is not None:
            self.metrics.errors.labels("recording").inc()
            raise ProxyError(503, problem, code="recording_unavailable", retry_after="2")

    async def recorded(self, receipt: Receipt | None = None) -> None:
        """Wait until ``receipt`` (default: everything published so far) is durable; 503 if it
        is not within ``record_timeout`` seconds."""
        receipt = receipt or self.publisher.barrier()
        timeout = self.config.record_timeout
        if not await receipt.wait(timeout):
            self.metrics.errors.labels("record_timeout").inc()
            raise ProxyError(
                503,
                f"the event log did not confirm this record within {timeout:g} s: retry "
                "(it may still arrive; consumers deduplicate by event id)",
                code="not_recorded",
                retry_after="2",
            )

    def publish(
        self, records: Sequence[RolloutRecord], rollout: Rollout | FinishedRollout | None = None
    ) -> Receipt:
        """Publish records with their text redacted (a rollout event's message and metadata
        values, a reward's verifier output; completion events are redacted as they are built,
        :func:`proxy.recording.completion_event`). Nothing is published for a rollout that
        was registered with ``record: false``."""
        if rollout is not None and not rollout.record:
            return self.publisher.publish([])
        if self.redactor.active:
            literals = (rollout.api_key,) if rollout is not None and rollout.api_key else ()
            records = [self._redact(r, literals) for r in records]
        self.count_redactions()
        return self.publisher.publish(records)

    def _redact(self, record: RolloutRecord, literals: tuple[str, ...]) -> RolloutRecord:
        text = self.redactor.text
        if isinstance(record, RolloutEvent):
            return replace(
                record,
                message=text(record.message, literals) if record.message else record.message,
                metadata={k: text(v, literals) for k, v in record.metadata.items()},
            )
        if isinstance(record, RewardEvent) and record.verifier_output:
            return replace(record, verifier_output=text(record.verifier_output, literals))
        return record

    def count_redactions(self) -> None:
        """Move the redactor's counts into ``openforge_proxy_redactions``."""
        if self.redactor.counts:
            self.metrics.count_redactions(self.redactor.counts)
            self.redactor.counts.clear()

    # --- pause during a weight swap -----------------------------------------------------------

    @property
    def paused(self) -> bool:
        return not self.resume.is_set()

    def pause(self, timeout: float) -> None:
        """Hold new calls until :meth:`unpause`, or ``timeout`` seconds (then they resume by
        themselves, with a warning and ``openforge_proxy_errors{error_class="pause_timeout"}``)."""
        if self._pause_timer is not None:
            self._pause_timer.cancel()
        self.resume.clear()
        self._pause_timer = asyncio.get_running_loop().call_later(timeout, self._pause_expired)

    def _pause_expired(self) -> None:
        log.warning("the pause was not ended by /admin/resume in time: resuming calls")
        self.auto_resumes += 1
        self.metrics.errors.labels("pause_timeout").inc()
        self.unpause()

    def unpause(self) -> None:
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None
        self.resume.set()

    def resumes_in(self) -> float | None:
        """Seconds until the current pause ends by itself (None: not paused)."""
        if self._pause_timer is None or not self.paused:
            return None
        left = self._pause_timer.when() - asyncio.get_running_loop().time()
        return round(max(0.0, left), 3)  # milliseconds: the loop's clock sum is not exact

    async def drain(self, timeout: float) -> bool:
        """While paused, wait until no call is in flight: True once none is, False after
        ``timeout`` seconds, or when the pause ends first (by its own timeout). Calls held at
        the gate are not in flight, and none is admitted while the pause lasts, so True means
        every call admitted before the pause has ended (and been recorded)."""
        left = self.resumes_in()
        if left is None:
            return self.in_flight == 0
        try:
            await asyncio.wait_for(self._idle.wait(), min(timeout, left))
        except TimeoutError:
            return False
        return self.paused

    def start_rollout(self, rollout_id: str, *, mint_key: bool, **fields: object) -> Rollout:
        """Register a rollout and publish its ``started`` RolloutEvent."""
        rollout = self.rollouts.create(rollout_id, mint_key=mint_key, **fields)
        self.publish(
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
            ],
            rollout,
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
        self.publish(
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
                    calls=rollout.calls,
                )
            ],
            rollout,
        )
        return self.rollouts.finish(rollout, phase)

    def publish_phase(
        self,
        rollout_id: str,
        phase: RolloutPhase,
        rollout: Rollout | FinishedRollout | None = None,
        **fields: object,
    ) -> None:
        """Publish a lifecycle phase reported by the orchestrator (no registry change)."""
        self.publish(
            [
                RolloutEvent(
                    event_id=f"ro_{rollout_id}_{phase.value}",
                    rollout_id=rollout_id,
                    phase=phase,
                    at_us=now_us(),
                    **fields,  # type: ignore[arg-type]
                )
            ],
            rollout,
        )

    async def admit(self) -> None:
        """Wait for (or, in reject mode, refuse with 429 during) a weight swap, then take a
        concurrency slot or refuse with 429. The caller gives the slot back with
        :meth:`release` exactly once (:class:`proxy.lifecycle.CallLifecycle` does). While the
        publisher cannot record in time, refuse with 503 (:meth:`check_recording`)."""
        self.check_recording()
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
        self._idle.clear()
        self.metrics.in_flight.inc()

    def release(self) -> None:
        """Give back the concurrency slot :meth:`admit` took."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
        self.metrics.in_flight.dec()
