"""The proxy's settings, checked when they are built."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from infra.eventlog.urls import LogKind, parse_url
from proxy.chat_template import TemplateEngine
from proxy.redaction import RedactionMode, RedactionPattern, build_patterns, read_pattern_file
from proxy.render import RenderMode
from schemas.errors import ConfigError
from schemas.faults import FaultPlan
from schemas.registry import choose


class UpstreamKind(StrEnum):
    """Which model-server endpoint the proxy calls (see :mod:`proxy.upstream`)."""

    COMPLETIONS = "completions"  # OpenAI-compatible /v1/completions with token ids, streaming
    GENERATE = "generate"  # vLLM's token-in/token-out /inference/v1/generate, not streaming


class PauseMode(StrEnum):
    """What new calls do while the policy's weights are being swapped."""

    WAIT = "wait"  # wait until resumed
    REJECT = "reject"  # 429 with Retry-After


@dataclass
class ProxyConfig:
    """Settings of one proxy instance.

    Attributes:
        upstream_url: base URL of the model server (vLLM), without ``/v1``.
        upstream_model: model name to request upstream; default: the server's first model.
        upstream_kind: ``completions`` (OpenAI-compatible, streaming) or ``generate`` (vLLM's
            token-in/token-out endpoint, engine policy versions, not streaming); a string is
            converted, a typo raises ConfigError.
        tokenizer: directory with the tokenizer and chat template; default: the upstream model's
            ``root`` path from ``/v1/models`` when that is a local directory.
        log_url: the event log, ``kafka://HOST:PORT`` or ``local:DIR``.
        spool_dir: where events wait while the event log is unavailable.
        admin_token: bearer token for ``/admin/*`` and rewards; None: one is generated at start
            and written to ``admin_token_file`` (mode 0600). Rollout keys never work there.
        admin_token_file: where a generated admin token is written (default
            ``<spool_dir>/../proxy-admin-token``).
        auto_register: unknown rollout ids in the path are registered on first use (else 404).
        require_keys: path rollouts that have a minted key accept only calls carrying it.
        open_mode: plain ``/v1/...`` calls are attributed by the harness's session identity.
        feedback_token: a credential that can post rewards (feedback, e.g. a person's thumbs
            up or a CI result, by rollout or by session) and nothing else; the admin token can
            too. None: only the admin token posts rewards.
        session_idle_timeout: open mode: seconds without a call after which a session's rollout
            ends (recorded ``finished``; the session's next call starts its next rollout);
            0 keeps sessions open until finished (see :mod:`proxy.sessions`).
        session_headers: headers that carry a session identity in open mode, in priority order
            (``traceparent`` contributes its trace id).
        session_client_header: open mode: a header that names the client (e.g.
            ``authorization``: each person's own key). A call that starts a new session of a
            client ends that client's previous session if it has no call waiting or in flight
            (recorded ``finished``, "a new session of its client"). None (default): sessions end
            only when idle or finished; a client running sessions side by side (sub-agents with
            sessions of their own) would otherwise end its own. Values are kept hashed.
        record_bodies: record request and response bodies (False: both are left out of every
            completion event; token ids, logprobs and the rest stay: see docs/proxy.md). The
            images in calls are stored only with the bodies (their hashes always).
        image_dir: where the images in calls are stored by content hash
            (:mod:`infra.image_store`); default: ``images`` in a local log's directory, else
            ``images`` beside ``spool_dir``. Proxies writing one Kafka log share this directory.
        redaction: ``mask`` (default) replaces secrets in recorded text by ``[REDACTED:NAME]``;
            ``off`` records text as it came. Token ids are never changed (:mod:`proxy.redaction`).
        redact_patterns: regular expressions redacted beside the defaults (``--redact``).
        redact_file: a file of more patterns, one a line (``--redact-file``).
        redact_defaults: also redact the default patterns (API keys, bearer tokens, private
            keys, e-mail addresses, this proxy's keys); the admin token and each rollout's own
            key are always redacted while redaction is on.
        max_body_bytes, max_concurrency, upstream_timeout: limits. A call's body is also held
            to half the event log's message limit (Kafka: 16 MiB), so its record fits.
        max_admin_body_bytes: body limit of the admin routes and rewards.
        body_timeout: seconds a client may take to send a body (then 408).
        record_timeout: seconds a call waits for its record to be durable before its last
            byte is sent (then 503; see :mod:`proxy.lifecycle`).
        publish_high_water: records waiting to be published at which new calls get 503
            (the event log is not keeping up).
        default_max_tokens: generation budget when a request names none.
        max_tokens_cap: upper bound on any request's generation budget (None: the context room);
            bounds episode length when harnesses ask for tens of thousands of tokens.
        max_model_len: context length; default: the upstream's ``max_model_len``.
        policy_version: the initial policy version stamped on generated tokens (None: the one
            last set through /admin/policy, remembered in ``spool_dir``; else 0).
        pause_mode: while weights swap, new calls ``wait`` or get 429 (``reject``); a string is
            converted, a typo raises ConfigError.
        pause_retry_after: the ``Retry-After`` seconds of that 429.
        pause_timeout: seconds after which a pause ends by itself (a trainer that died
            mid-swap must not stall every rollout); ``POST /admin/pause`` may name its own.
        log_fsync: the embedded local log syncs each batch of records to disk before the
            calls it holds end (False: the records reach the OS first, so they survive a proxy
            crash but not a machine crash; Kafka's durability is the broker's ack either way).
            The spool always syncs.
        render_mode: how a continuation's new messages are rendered: ``auto`` (a window of the
            conversation, verified against a full rendering on the first calls), ``verify``
            (both, every call) or ``full`` (see :mod:`proxy.render`); a typo raises ConfigError.
        template_engine: what renders the chat template: ``auto`` (MiniJinja where it renders
            exactly what the tokenizer's own template does, checked at load and on the first
            calls) or ``jinja2`` (the tokenizer's own, always; see :mod:`proxy.chat_template`).
        finished_rollouts: how many finished rollouts are remembered (oldest forgotten first),
            so a late reward is still attributed and a late call gets a clear 410.
        faults: the faults injected into calls on purpose (``schemas.faults``; None: none).
    """

    upstream_url: str
    upstream_model: str | None = None
    upstream_kind: UpstreamKind = UpstreamKind.COMPLETIONS
    tokenizer: Path | None = None
    log_url: str = "local:events"
    spool_dir: Path = Path("spool")
    admin_token: str | None = None
    admin_token_file: Path | None = None
    feedback_token: str | None = None
    auto_register: bool = False
    require_keys: bool = False
    open_mode: bool = False
    session_idle_timeout: float = 1800.0
    session_headers: list[str] = field(
        default_factory=lambda: [
            "x-openforge-session",
            "session-id",
            "x-claude-code-session-id",
            "traceparent",
        ]
    )
    session_client_header: str | None = None
    record_bodies: bool = True
    image_dir: Path | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    max_admin_body_bytes: int = 64 * 1024
    body_timeout: float = 60.0
    record_timeout: float = 30.0
    publish_high_water: int = 5_000
    max_concurrency: int = 256
    upstream_timeout: float = 600.0
    default_max_tokens: int = 1024
    max_tokens_cap: int | None = None
    max_model_len: int | None = None
    policy_version: int | None = None
    pause_mode: PauseMode = PauseMode.WAIT
    pause_retry_after: int = 1
    pause_timeout: float = 300.0
    finished_rollouts: int = 10_000
    faults: FaultPlan | None = None
    render_mode: RenderMode = RenderMode.AUTO
    template_engine: TemplateEngine = TemplateEngine.AUTO
    log_fsync: bool = True
    redaction: RedactionMode = RedactionMode.MASK
    redact_patterns: list[str] = field(default_factory=list)
    redact_file: Path | None = None
    redact_defaults: bool = True
    patterns: list[RedactionPattern] = field(init=False, repr=False)  # compiled, from the above

    def images_root(self) -> Path:
        """The directory of the images in calls (see ``image_dir``)."""
        if self.image_dir is not None:
            return self.image_dir
        url = parse_url(self.log_url)
        if url.kind is LogKind.LOCAL:
            return url.path / "images"
        return self.spool_dir.parent / "images"

    def __post_init__(self) -> None:
        self.upstream_kind = choose(UpstreamKind, self.upstream_kind, "upstream_kind")
        self.redaction = choose(RedactionMode, self.redaction, "redaction mode")
        extra = list(self.redact_patterns)
        if self.redact_file is not None:
            extra += read_pattern_file(self.redact_file)
        self.patterns = (
            build_patterns(extra, defaults=self.redact_defaults)
            if self.redaction is RedactionMode.MASK
            else []
        )
        self.pause_mode = choose(PauseMode, self.pause_mode, "pause_mode")
        self.render_mode = choose(RenderMode, self.render_mode, "render_mode")
        self.template_engine = choose(TemplateEngine, self.template_engine, "template_engine")
        if self.feedback_token is not None and (
            self.feedback_token.startswith("ofk_") or self.feedback_token == self.admin_token
        ):
            raise ConfigError(
                "the feedback token must be a secret of its own: not a rollout key (ofk_...) "
                "and not the admin token"
            )
        if not self.session_idle_timeout >= 0:
            raise ConfigError(
                "session_idle_timeout must be 0 (sessions end only when finished) or a "
                "positive number of seconds"
            )
        if self.session_client_header is not None:
            self.session_client_header = self.session_client_header.strip().lower()
            if not self.open_mode or not self.session_client_header:
                raise ConfigError(
                    "session_client_header needs open mode (--open) and a header name, e.g. "
                    "--session-client-header authorization"
                )
        for name in ("body_timeout", "record_timeout", "pause_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be a positive number of seconds")
        if self.finished_rollouts < 0:
            raise ConfigError(f"finished_rollouts must be 0 or more, not {self.finished_rollouts}")
