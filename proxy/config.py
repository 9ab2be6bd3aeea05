"""The proxy's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ProxyConfig:
    """Settings of one proxy instance.

    Attributes:
        upstream_url: base URL of the model server (vLLM), without ``/v1``.
        upstream_model: model name to request upstream; default: the server's first model.
        upstream_kind: ``completions`` (OpenAI-compatible, streaming) or ``generate`` (vLLM's
            token-in/token-out endpoint, engine weight versions, not streaming).
        tokenizer: directory with the tokenizer and chat template; default: the upstream model's
            ``root`` path from ``/v1/models`` when that is a local directory.
        log_url: the event log, ``kafka://HOST:PORT`` or ``local:DIR``.
        spool_dir: where events wait while the event log is unavailable.
        admin_token: bearer token for ``/admin/*``; None leaves admin open (bind to loopback).
        auto_register: unknown rollout ids in the path are registered on first use (else 404).
        require_keys: path rollouts that have a minted key accept only calls carrying it.
        open_mode: plain ``/v1/...`` calls are attributed by the harness's session identity.
        session_headers: headers that carry a session identity in open mode, in priority order
            (``traceparent`` contributes its trace id).
        record_bodies: record request and response bodies (False: redacted).
        max_body_bytes, max_concurrency, upstream_timeout: limits.
        default_max_tokens: generation budget when a request names none.
        max_tokens_cap: upper bound on any request's generation budget (None: the context room);
            bounds episode length when harnesses ask for tens of thousands of tokens.
        max_model_len: context length; default: the upstream's ``max_model_len``.
        policy_version: the initial policy version stamped on generated tokens.
        pause_mode: while weights swap, new requests ``wait`` or get 429 (``reject``).
    """

    upstream_url: str
    upstream_model: str | None = None
    upstream_kind: str = "completions"
    tokenizer: Path | None = None
    log_url: str = "local:events"
    spool_dir: Path = Path("spool")
    admin_token: str | None = None
    auto_register: bool = False
    require_keys: bool = False
    open_mode: bool = False
    session_headers: list[str] = field(
        default_factory=lambda: [
            "x-openforge-session",
            "session-id",
            "x-claude-code-session-id",
            "traceparent",
        ]
    )
    record_bodies: bool = True
    max_body_bytes: int = 32 * 1024 * 1024
    max_concurrency: int = 256
    upstream_timeout: float = 600.0
    default_max_tokens: int = 1024
    max_tokens_cap: int | None = None
    max_model_len: int | None = None
    policy_version: int = 0
    pause_mode: str = "wait"
    pause_retry_after: int = 1
