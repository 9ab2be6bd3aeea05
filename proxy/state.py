"""What one proxy's handlers share: its settings, the renderer and the upstream, the policy
version new tokens carry, and four parts with one job each: the rollouts
(:class:`~proxy.rollouts.RolloutRegistry`), the recorder (:class:`~proxy.recorder.Recorder`),
the gate (:class:`~proxy.gate.Gate`: the pause and the concurrency slots) and the metrics
(:class:`~proxy.metrics.ProxyMetrics`)."""

from __future__ import annotations

from infra.image_store import ImageStore
from proxy.config import ProxyConfig
from proxy.gate import Gate
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher, Receipt
from proxy.recorder import Recorder
from proxy.redaction import Redactor
from proxy.render import Renderer
from proxy.rollouts import Rollout, RolloutRegistry
from proxy.session_clients import ClientSessions
from proxy.session_log import LiveSession, SessionLog
from proxy.swap_state import remembered
from proxy.upstream import Upstream
from schemas.enums import RolloutPhase


class ProxyState:
    """The parts of one proxy, wired from its config. ``message_limit``: the event log's
    largest message (None: no limit)."""

    def __init__(
        self,
        config: ProxyConfig,
        renderer: Renderer,
        upstream: Upstream,
        publisher: Publisher,
        max_model_len: int,
        *,
        metrics: ProxyMetrics | None = None,
        message_limit: int | None = None,
    ) -> None:
        self.config, self.renderer, self.upstream = config, renderer, upstream
        self.max_model_len = max_model_len
        self.message_limit = message_limit
        self.metrics = metrics if metrics is not None else ProxyMetrics()
        self.rollouts = RolloutRegistry(config.finished_rollouts)
        # open mode: session ends survive a restart (proxy.session_log)
        self.session_log = SessionLog(config.spool_dir, config.finished_rollouts)
        if config.open_mode:
            self.rollouts.remember_sessions(self.session_log.load())
            self._take_over(self.session_log.take_live())
        self.clients = ClientSessions()  # open mode with session_client_header
        self.recorder = Recorder(
            publisher,
            redactor_of(config),
            self.metrics,
            record_timeout=config.record_timeout,
            record_bodies=config.record_bodies,
            images=ImageStore(config.images_root()),
        )
        self.gate = Gate(
            config.max_concurrency, config.pause_mode, config.pause_retry_after, self.metrics
        )
        # ``openforge_proxy_policy_version`` reads it; see proxy.swap_state
        self.policy_version = (
            config.policy_version
            if config.policy_version is not None
            else remembered(config.spool_dir) or 0
        )
        self.metrics.policy_version.set_function(lambda: self.policy_version)

    async def end(
        self,
        rollout: Rollout,
        phase: RolloutPhase,
        *,
        backend: str | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Record the rollout's end and evict it from the live rollouts (a late reward still
        finds it, :meth:`RolloutRegistry.finish`); return once that record is durable.
        ``metadata`` is added to the rollout's own in that record."""
        receipt = self.end_soon(
            rollout,
            phase,
            backend=backend,
            exit_code=exit_code,
            message=message,
            metadata=metadata,
        )
        await self.recorder.durable(receipt)

    def end_soon(
        self,
        rollout: Rollout,
        phase: RolloutPhase,
        *,
        backend: str | None = None,
        message: str | None = None,
        exit_code: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Receipt:
        """:meth:`end` without waiting: the end record is queued (published in order, before
        any record queued after it) and the rollout evicted; its receipt to await."""
        receipt = self.recorder.ended(
            rollout,
            phase,
            backend=backend,
            exit_code=exit_code,
            message=message,
            metadata=metadata,
        )
        self.rollouts.finish(rollout, phase)
        if rollout.session is not None:
            self.session_log.append(rollout.session, rollout.rollout_id)
        return receipt

    def _take_over(self, sessions: list[LiveSession]) -> None:
        """The sessions live when the previous proxy on this spool stopped, live again (no new
        start is recorded: they go on)."""
        for live in sessions:
            rollout = self.rollouts.create(
                live.rollout_id, mint_key=False, session=live.identity,
                metadata={"session": live.identity},
            )  # fmt: skip
            rollout.number_from(live.calls)

    def save_live_sessions(self) -> None:
        """At a stop: the live sessions, for the next proxy on this spool directory."""
        self.session_log.save_live(
            [
                LiveSession(r.session, r.rollout_id, r.calls)
                for r in self.rollouts.live()
                if r.session is not None
            ]
        )

    @property
    def body_limit(self) -> int:
        """A call's body limit: ``max_body_bytes``, and at most half the log's message limit
        (the rest is room for the generation and the record's other fields)."""
        limit = self.config.max_body_bytes
        return limit if self.message_limit is None else min(limit, self.message_limit // 2)


def redactor_of(config: ProxyConfig) -> Redactor:
    """The config's redactor: its patterns, and the admin token as a secret (none of either
    when redaction is off)."""
    secrets = [config.admin_token] if config.patterns else []
    return Redactor(config.patterns, [s for s in secrets if s])
