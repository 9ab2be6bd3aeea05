"""The proxy's admin credential: rewards, rollout registration and lifecycle, policy and pause.

The proxy always has one. When none is configured, a random token is generated at start and
written to a file only its owner can read (mode 0600); the log line says where. Rollout keys
(``ofk_...``) are for completions only and never pass as the admin token: an agent holding its
rollout's key cannot post a reward, finish its rollout or touch another one.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from proxy.config import ProxyConfig
from proxy.errors import ProxyError
from schemas.errors import ConfigError

log = logging.getLogger("openforge.proxy")
TOKEN_PREFIX = "ofa_"


def token_file(config: ProxyConfig) -> Path:
    return config.admin_token_file or config.spool_dir.parent / "proxy-admin-token"


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path``, readable by its owner only (0600), replacing it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secret.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def ensure_admin_token(config: ProxyConfig) -> str:
    """The configured admin token, or a new one written to :func:`token_file` (set on
    ``config``)."""
    if config.admin_token:
        if config.admin_token.startswith("ofk_"):
            raise ConfigError("the admin token must not look like a rollout key (ofk_...)")
        return config.admin_token
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    path = token_file(config)
    try:
        write_secret(path, token)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the proxy's admin token to {path}: {exc}; pass --admin-token-file "
            "or set OPENFORGE_ADMIN_TOKEN"
        ) from exc
    config.admin_token = token
    log.warning(
        "admin token generated and written to %s (mode 0600); send it as "
        "'Authorization: Bearer $(cat %s)' to /admin/* and reward routes",
        path,
        path,
    )
    return token


def check_feedback(config: ProxyConfig, given: str | None) -> str:
    """Who may post a reward: ``"admin"`` (the admin token) or ``"feedback"`` (the feedback
    token, which can do nothing else); 401 for anyone else."""
    feedback = config.feedback_token
    if not feedback:
        check_admin(config, given)
        return "admin"
    if given and hmac.compare_digest(given.encode(), feedback.encode()):
        return "feedback"
    try:
        check_admin(config, given)
    except ProxyError:
        raise ProxyError(
            401,
            "posting a reward needs the proxy's admin token or its feedback token "
            "(Authorization: Bearer ...); rollout keys only make completions",
            code="feedback_token_required",
        ) from None
    return "admin"


def check_admin(config: ProxyConfig, given: str | None) -> None:
    """401 unless ``given`` is the admin token."""
    token = config.admin_token
    if not token or not given or not hmac.compare_digest(given.encode(), token.encode()):
        raise ProxyError(
            401,
            "this route needs the proxy's admin token (Authorization: Bearer ...); rollout keys "
            "only make completions",
            code="admin_token_required",
        )
