"""Which rollout a call records into, and reading its body within the limits.

Attribution, in order: a minted rollout key (``Authorization: Bearer ofk_...`` or
``x-api-key``) names its rollout; a ``/rollout/{rollout_id}/...`` path names one (and must agree
with a key); in open mode a session identity header names its session's rollout
(:mod:`proxy.sessions`). A key minted for one rollout never records into another. Failures are
ProxyErrors that say what to do:
401 (no or unknown key), 403 (key of another rollout), 404 (unknown rollout), 410 (finished).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from proxy.bodies import read_object
from proxy.errors import ProxyError
from proxy.rollouts import KEY_PREFIX, Rollout
from proxy.session_clients import ClientSessions
from proxy.sessions import session_rollout
from proxy.state import ProxyState


def request_key(request: Request) -> str | None:
    """The bearer token or ``x-api-key`` of a request, if any."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def session_identity(request: Request, headers: list[str]) -> str | None:
    """The first session identity among ``headers`` (``traceparent`` gives its trace id)."""
    for name in headers:
        value = request.headers.get(name)
        if not value:
            continue
        if name == "traceparent":  # version-traceid-parentid-flags
            parts = value.split("-")
            if len(parts) >= 2 and parts[1].strip("0"):
                return f"trace-{parts[1]}"
            continue
        return value
    return None


def _client(state: ProxyState, request: Request) -> str | None:
    """The caller's client (hashed), by ``session_client_header``; None when that is unset or
    the call does not carry it."""
    header = state.config.session_client_header
    value = request.headers.get(header) if header else None
    return ClientSessions.client_of(value) if value else None


def _finished(rollout_id: str) -> ProxyError:
    return ProxyError(
        410,
        f"rollout {rollout_id!r} has finished: register a new rollout "
        "(POST /admin/rollouts) for more calls",
        code="rollout_finished",
    )


def _register(state: ProxyState, rollout_id: str) -> Rollout:
    """Register the rollout a call names (auto-register, open mode) and record its start. The
    call does not wait for that record: its own record is published after it, and the publisher
    keeps their order."""
    rollout = state.rollouts.create(rollout_id, mint_key=False)
    state.recorder.started(rollout)
    return rollout


def attribute(state: ProxyState, request: Request) -> Rollout:
    """The live rollout this call records into, or a 401/403/404/410 ProxyError."""
    key = request_key(request)
    key_rollout = None
    if key and key.startswith(KEY_PREFIX):
        key_rollout = state.rollouts.by_key(key)
        if key_rollout is None:
            done = state.rollouts.finished_by_key(key)
            if done is not None:
                raise _finished(done.rollout_id)
            raise ProxyError(
                401,
                "unknown rollout key: mint one with POST /admin/rollouts",
                code="invalid_api_key",
            )
    path_id = request.path_params.get("rollout_id")
    if path_id:
        if key_rollout is not None and key_rollout.rollout_id != path_id:
            raise ProxyError(
                403, "this rollout key belongs to another rollout", code="rollout_mismatch"
            )
        rollout = state.rollouts.get(path_id)
        if rollout is None:
            if state.rollouts.finished(path_id) is not None:
                raise _finished(path_id)
            if not state.config.auto_register:
                raise ProxyError(
                    404,
                    f"unknown rollout {path_id!r}: register it with "
                    "POST /admin/rollouts (or start the proxy with --auto-register)",
                    code="rollout_not_found",
                )
            rollout = _register(state, path_id)
        if state.config.require_keys and rollout.api_key and key_rollout is None:
            raise ProxyError(401, "this rollout requires its key", code="invalid_api_key")
        return rollout
    if key_rollout is not None:
        return key_rollout
    if state.config.open_mode:
        session = session_identity(request, state.config.session_headers)
        if session:
            return session_rollout(state, session, _client(state, request))
        raise ProxyError(
            401,
            "open mode: no session identity header "
            f"({', '.join(state.config.session_headers)}) on this request",
            code="no_session",
        )
    raise ProxyError(
        401,
        "no rollout: call /rollout/{rollout_id}/v1/..., send a rollout key, "
        "or start the proxy in open mode",
        code="no_rollout",
    )


async def read_body(
    state: ProxyState, request: Request, *, admin: bool = False, optional: bool = False
) -> dict[str, Any]:
    """The request's JSON object body, checked by :func:`proxy.bodies.read_object` against the
    call limit (:attr:`ProxyState.body_limit`) or, for ``admin`` routes, the admin limit."""
    config = state.config
    limit = config.max_admin_body_bytes if admin else state.body_limit
    return await read_object(request, limit, config.body_timeout, optional=optional)
