"""The recorder: a call or a rollout's lifecycle change in, a redacted record published, its
receipt out.

Each method makes one record (:mod:`proxy.recording`, which also says what is redacted),
publishes it and returns the :class:`~proxy.publisher.Receipt` of exactly that record, so a
handler waits for its own record (:meth:`Recorder.durable`), not for everything published
before it. Nothing is published for a rollout registered with ``record: false``: its receipt is
resolved at once. The redactor's counts go to ``openforge_proxy_redactions`` as records are
published. :meth:`Recorder.check` refuses with 503 while the publisher cannot record in time;
a caller checks before it changes anything, so a refused request leaves no trace.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.image_store import ImageStore
from proxy.canonical import Generation
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher, Receipt
from proxy.recording import (
    CallContext,
    completion_event,
    described,
    now_us,
    own_secrets,
    redacted,
    rollout_event,
)
from proxy.redaction import Redactor
from proxy.rollouts import FinishedRollout, Rollout
from schemas.codec import RolloutRecord
from schemas.completion import CompletionEvent
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent

# The proxy's rollout of a record's id, if it knows one (live or remembered as finished).
Known = Rollout | FinishedRollout | None


class Recorder:
    """Makes, redacts and publishes the proxy's records; one receipt per record.

    ``record_timeout``: seconds :meth:`durable` waits for a receipt. ``record_bodies``: whether
    completion events carry the request and response bodies; ``images``: where the images of
    recorded bodies are stored (None: bodies with images are not recorded)."""

    def __init__(
        self,
        publisher: Publisher,
        redactor: Redactor,
        metrics: ProxyMetrics,
        *,
        record_timeout: float,
        record_bodies: bool,
        images: ImageStore | None = None,
    ) -> None:
        self.publisher = publisher
        self.redactor = redactor
        self._metrics = metrics
        self._timeout = record_timeout
        self._bodies = record_bodies
        self._images = images

    # --- health -------------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why new records may not be recorded in time (None: recording is healthy)."""
        return self.publisher.problem()

    def check(self) -> None:
        """503 while the publisher cannot record in time (dead, stalled, or behind)."""
        problem = self.publisher.problem()
        if problem is not None:
            self._metrics.errors.labels("recording").inc()
            raise ProxyError(503, problem, code="recording_unavailable", retry_after="2")

    def counts(self) -> dict[str, int]:
        """Records published, spooled, dead-lettered and pending, and the publisher's retried
        batches (``worker_errors``), since the proxy started."""
        stats = self.publisher.stats
        return {
            "published": stats.published,
            "spooled": stats.spooled,
            "dead_lettered": stats.dead_lettered,
            "pending": self.publisher.pending,
            "worker_errors": stats.worker_errors,
        }

    async def durable(self, receipt: Receipt) -> None:
        """Wait until ``receipt`` resolves; a 503 ProxyError if it does not within
        ``record_timeout`` seconds (the record may still arrive)."""
        if not await receipt.wait(self._timeout):
            self._metrics.errors.labels("record_timeout").inc()
            raise ProxyError(
                503,
                f"the event log did not confirm this record within {self._timeout:g} s: retry "
                "(it may still arrive; consumers deduplicate by event id)",
                code="not_recorded",
                retry_after="2",
            )

    # --- records ------------------------------------------------------------------------------

    def call(self, ctx: CallContext, gen: Generation) -> tuple[CompletionEvent, Receipt]:
        """The ended call's completion event (redacted as it is built; see
        :func:`proxy.recording.completion_event` for the order it must be called in), and the
        receipt of its publication."""
        images = self._images if ctx.rollout.record else None
        stored = (images.stored, images.stored_bytes) if images is not None else (0, 0)
        event = completion_event(ctx, gen, self._bodies, self.redactor, images)
        if event.image_ids and ctx.rollout.record:
            self._count_images(event, images, stored)
        if not ctx.rollout.record:
            return event, self.publisher.publish([])
        self._count_redactions()
        return event, self.publisher.publish([event])

    def _count_images(
        self, event: CompletionEvent, images: ImageStore | None, before: tuple[int, int]
    ) -> None:
        self._metrics.images.labels("in_prompt").inc(len(event.image_ids))
        if images is not None:
            self._metrics.images.labels("stored").inc(images.stored - before[0])
            self._metrics.image_bytes.inc(images.stored_bytes - before[1])

    def started(self, rollout: Rollout) -> Receipt:
        """The rollout's ``started`` event, at its registration."""
        event = rollout_event(
            rollout.rollout_id, RolloutPhase.STARTED, rollout.created_us, **described(rollout)
        )
        return self._publish(event, rollout)

    def ended(
        self,
        rollout: Rollout,
        phase: RolloutPhase,
        *,
        backend: str | None = None,
        exit_code: int | None = None,
        message: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Receipt:
        """The rollout's end in ``phase``, now: how long it ran and how many calls it made;
        ``metadata`` added to the rollout's own."""
        at = now_us()
        about = described(rollout)
        about["metadata"] = {**rollout.metadata, **(metadata or {})}
        event = rollout_event(
            rollout.rollout_id,
            phase,
            at,
            **about,
            backend=backend,
            exit_code=exit_code,
            duration_s=(at - rollout.created_us) / 1e6,
            message=message,
            calls=rollout.calls,
        )
        return self._publish(event, rollout)

    def reward(self, event: RewardEvent, rollout: Rollout | FinishedRollout | None) -> Receipt:
        """A reward event; ``rollout`` is the proxy's rollout of its id, if it knows one."""
        return self._publish(event, rollout)

    def many(self, records: Sequence[tuple[RolloutRecord, Known]]) -> Receipt:
        """Records published together, in order (one write): each with the proxy's rollout of
        its id, if it knows one; the receipt resolves when all are durable."""
        kept = [self._kept(record, rollout) for record, rollout in records]
        self._count_redactions()
        return self.publisher.publish([r for r in kept if r is not None])

    def _publish(self, record: RolloutRecord, rollout: Known) -> Receipt:
        return self.many([(record, rollout)])

    def _kept(self, record: RolloutRecord, rollout: Known) -> RolloutRecord | None:
        """``record`` as published (redacted), or None for a rollout that records nothing."""
        if rollout is not None and not rollout.record:
            return None
        if self.redactor.active:
            return redacted(record, self.redactor, own_secrets(rollout))
        return record

    def _count_redactions(self) -> None:
        if self.redactor.counts:
            self._metrics.count_redactions(self.redactor.counts)
            self.redactor.counts.clear()
