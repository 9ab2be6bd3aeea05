"""The proxy's ASGI app: the route table, and the services its lifespan starts and stops.

Routes (each call and model route also without the ``/rollout/{rollout_id}`` prefix, attributed
by rollout key or, in open mode, by session identity):

    POST /rollout/{rollout_id}<dialect path>           a call, one route per registered dialect:
                                                       /v1/chat/completions, /v1/responses,
                                                       /v1/messages (also ?beta=true)
    POST /rollout/{rollout_id}/v1/messages/count_tokens
    GET  /rollout/{rollout_id}/v1/models
    POST /rollout/{rollout_id}/reward                  record a RewardEvent (admin or feedback)
    POST /sessions/{session}/reward                    the same, to a session's latest rollout
    POST /responses/{response_id}/reward               the same, to the rollout of a response id
    POST /admin/rollouts                               register a rollout, mint its key
    POST /admin/rollouts/{rollout_id}/finish           record its end (RolloutEvent)
    POST /admin/rollouts/{rollout_id}/phase            record queued / verified / infra_failed;
                                                       a verified phase may carry the reward
    POST /admin/rollouts/phases                        many queued / verified phases at once
    GET|POST /admin/policy                             read or set the policy version
    POST /admin/pause, /admin/resume                   gate new calls during a weight swap
                                                       (a pause ends by itself after a timeout;
                                                       it can wait for the calls in flight)
    GET  /health, /metrics

Handlers live in :mod:`proxy.calls`, :mod:`proxy.model_info`, :mod:`proxy.admin`,
:mod:`proxy.phases` and :mod:`proxy.rewards`. Every
error is a JSON body in the caller's dialect, also an unknown route (404), a wrong method (405)
and a bug (500): the dialect of the path's prefix (``/v1/messages...`` or an
``anthropic-version`` header: Anthropic; else OpenAI).

Crash guarantee: a call whose response completed is durable in the event log, the spool or
the dead-letter file before its last byte is sent, so a SIGKILL of the proxy loses no answered
call (:mod:`proxy.lifecycle`); while the publisher cannot record in time, new calls get a 503
and ``/health`` answers 503 (:mod:`proxy.publisher`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from infra.eventlog import (
    EVENTS_TOPIC,
    EventLogWriter,
    create_topics,
    message_limit,
    open_writer,
)
from proxy import admin, calls, model_info, phases, rewards
from proxy.config import ProxyConfig
from proxy.credentials import ensure_admin_token
from proxy.dialects.base import Dialect, error_response
from proxy.dialects.registry import dialect_for, dialects
from proxy.discovery import discover
from proxy.errors import ProxyError
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher
from proxy.render import Renderer
from proxy.sessions import reaping
from proxy.state import ProxyState
from proxy.swap_state import pause_left
from proxy.upstream import UPSTREAMS

log = logging.getLogger("openforge.proxy")

Handler = Callable[[Request], Awaitable[Response]]


def _guard(handler: Callable[[ProxyState, Request], Awaitable[Response]]) -> Handler:
    """Run a handler with the app state; ProxyErrors become JSON in the caller's dialect."""

    async def run(request: Request) -> Response:
        state: ProxyState = request.app.state.proxy
        try:
            return await handler(state, request)
        except ProxyError as exc:
            return error_response(exc, dialect_for(request.url.path, request.headers))

    return run


def _call(dialect: Dialect) -> Handler:
    async def run(request: Request) -> Response:
        return await calls.handle(request.app.state.proxy, request, dialect)

    return run


def routes() -> list[Route]:
    out = []
    for prefix in ("/rollout/{rollout_id}", ""):
        out += [Route(prefix + d.path, _call(d), methods=["POST"]) for d in dialects()]
        out += [
            Route(
                f"{prefix}/v1/messages/count_tokens",
                _guard(model_info.count_tokens),
                methods=["POST"],
            ),
            Route(f"{prefix}/v1/models", _guard(model_info.models), methods=["GET"]),
        ]
    return [
        *out,
        Route("/rollout/{rollout_id}/reward", _guard(rewards.reward), methods=["POST"]),
        Route("/sessions/{session}/reward", _guard(rewards.session_reward), methods=["POST"]),
        Route("/responses/{response_id}/reward", _guard(rewards.response_reward), methods=["POST"]),
        Route("/admin/rollouts", _guard(admin.create_rollout), methods=["POST"]),
        Route(
            "/admin/rollouts/{rollout_id}/finish", _guard(admin.finish_rollout), methods=["POST"]
        ),
        Route("/admin/rollouts/phases", _guard(phases.record_phases), methods=["POST"]),
        Route("/admin/rollouts/{rollout_id}/phase", _guard(phases.record_phase), methods=["POST"]),
        Route("/admin/policy", _guard(admin.policy), methods=["GET", "POST"]),
        Route("/admin/pause", _guard(admin.pause), methods=["POST"]),
        Route("/admin/resume", _guard(admin.resume), methods=["POST"]),
        Route("/health", _guard(admin.health), methods=["GET"]),
        Route("/metrics", _guard(admin.metrics), methods=["GET"]),
    ]


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 in the dialect of the path's prefix."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    elif status == 404:
        message = f"no route {request.url.path}: see docs/proxy.md for the proxy's routes"
    else:
        message = str(exc.detail)
    response = error_response(
        ProxyError(status, message), dialect_for(request.url.path, request.headers)
    )
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _bug(request: Request, exc: Exception) -> Response:
    """A bug: 500 in the caller's dialect (the traceback is logged by the server)."""
    error = ProxyError(500, f"internal proxy error ({type(exc).__name__}); please report it")
    return error_response(error, dialect_for(request.url.path, request.headers))


def _open_log(config: ProxyConfig) -> EventLogWriter:
    """The event log's writer, its topic made first (on Kafka, with the URL's partitions; an
    existing topic is left as it is). Called by the publisher's thread, which spools while
    this raises: within about 5 s when the broker is down, as the writer's own bootstrap, so
    a call's record is spooled well within its ``record_timeout``."""
    create_topics(config.log_url, [EVENTS_TOPIC], timeout_s=5.0)
    return open_writer(config.log_url, fsync=config.log_fsync)


def create_app(
    config: ProxyConfig, open_log: Callable[[], EventLogWriter] | None = None
) -> Starlette:
    """The proxy app; services (upstream client, publisher) start in its lifespan, which
    raises ConfigError when the upstream cannot be discovered. The admin token is settled here
    (generated and written 0600 when none is configured). ``open_log`` opens the event log
    writer (default: the one ``config.log_url`` names)."""
    ensure_admin_token(config)
    limit = message_limit(config.log_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        model, tokenizer, max_len = await discover(config)
        renderer = Renderer(tokenizer, config.render_mode, engine=config.template_engine)
        metrics = ProxyMetrics()
        upstream = UPSTREAMS.get(config.upstream_kind)(
            config.upstream_url, model, timeout=config.upstream_timeout, decode=renderer.decode_text
        )
        publisher = Publisher(
            open_log or (lambda: _open_log(config)),
            config.spool_dir,
            high_water=config.publish_high_water,
            on_publish=metrics.on_publish,
            on_dead_letter=metrics.events_dead_lettered.inc,
            max_message_bytes=limit,
        )
        app.state.proxy = ProxyState(
            config, renderer, upstream, publisher, max_len, metrics=metrics, message_limit=limit
        )
        # Move everything loaded so far (torch, transformers, ...) out of the cyclic collector's
        # reach: full collections over millions of start-up objects stalled requests.
        gc.freeze()
        if (left := pause_left(config.spool_dir)) is not None:  # proxy.swap_state
            log.warning("paused before the restart: holding new calls for %.0f s more", left)
            app.state.proxy.gate.pause(left)
        idle = config.session_idle_timeout if config.open_mode else 0
        try:
            async with reaping(app.state.proxy, idle):
                yield
        finally:
            if config.open_mode:  # proxy.session_log: the next proxy takes them over
                app.state.proxy.save_live_sessions()
            await upstream.aclose()
            publisher.close()

    handlers = {HTTPException: _http_error, Exception: _bug}
    return Starlette(routes=routes(), lifespan=lifespan, exception_handlers=handlers)
