"""The proxy's ASGI app: dialect routes, rollout and admin endpoints, health and metrics.

Routes (each completion route also without the ``/rollout/{rollout_id}`` prefix, attributed by
rollout key or, in open mode, by session identity):

    POST /rollout/{rollout_id}/v1/chat/completions     OpenAI Chat Completions
    POST /rollout/{rollout_id}/v1/responses            OpenAI Responses
    POST /rollout/{rollout_id}/v1/messages             Anthropic Messages (also ?beta=true)
    POST /rollout/{rollout_id}/v1/messages/count_tokens
    GET  /rollout/{rollout_id}/v1/models
    POST /rollout/{rollout_id}/reward                  record a RewardEvent
    POST /admin/rollouts                               register a rollout, mint its key
    POST /admin/rollouts/{rollout_id}/finish           record its end (RolloutEvent)
    GET|POST /admin/policy                             read or set the policy version
    POST /admin/pause, /admin/resume                   gate new requests during a weight swap
    GET  /health, /metrics
"""

from __future__ import annotations

import contextlib
import gc
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infra.eventlog import open_writer
from proxy import completions
from proxy.completions import attribute, read_body
from proxy.config import ProxyConfig
from proxy.errors import ProxyError, error_response
from proxy.metrics import ProxyMetrics
from proxy.publisher import Publisher
from proxy.render import Renderer
from proxy.state import ProxyState, now_us
from proxy.upstream import CompletionsUpstream, GenerateUpstream, Upstream
from schemas.enums import Dialect, RolloutPhase
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

Handler = Callable[[Request], Awaitable[Response]]


def _dialect_of(request: Request) -> Dialect:
    anthropic = "anthropic-version" in request.headers or "/messages" in request.url.path
    return Dialect.MESSAGES if anthropic else Dialect.CHAT


def _guard(handler: Callable[[ProxyState, Request], Awaitable[Response]]) -> Handler:
    """Run a handler with the app state; ProxyErrors become JSON in the caller's dialect."""

    async def run(request: Request) -> Response:
        state: ProxyState = request.app.state.proxy
        try:
            return await handler(state, request)
        except ProxyError as exc:
            return error_response(exc, _dialect_of(request))

    return run


def _admin(state: ProxyState, request: Request) -> None:
    token = state.config.admin_token
    if token is None:
        return
    given = completions.request_key(request) or ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ProxyError(401, "admin endpoints need the admin token (Authorization: Bearer ...)")


def _completion(dialect: Dialect) -> Handler:
    async def run(request: Request) -> Response:
        return await completions.handle(request.app.state.proxy, request, dialect)

    return run


async def models(state: ProxyState, request: Request) -> Response:
    if not (request.path_params.get("rollout_id") or state.config.open_mode):
        attribute(state, request)
    name = state.upstream.model
    if "anthropic-version" in request.headers:
        return JSONResponse(
            {
                "data": [
                    {
                        "type": "model",
                        "id": name,
                        "display_name": name,
                        "created_at": "2026-01-01T00:00:00Z",
                    }
                ],
                "has_more": False,
                "first_id": name,
                "last_id": name,
            }
        )
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "openforge",
                    "max_model_len": state.max_model_len,
                }
            ],
        }
    )


async def count_tokens(state: ProxyState, request: Request) -> Response:
    from proxy.dialects import messages as anthropic

    attribute(state, request)
    body = await read_body(state, request)
    body.setdefault("max_tokens", 1)
    req = anthropic.parse(body)
    return JSONResponse({"input_tokens": state.renderer.count(req.messages, req.tools)})


async def reward(state: ProxyState, request: Request) -> Response:
    rollout_id = request.path_params["rollout_id"]
    key = completions.request_key(request)
    rollout = state.rollouts.get(rollout_id)
    owner = rollout is not None and rollout.api_key is not None and key == rollout.api_key
    if not owner:
        _admin(state, request)
    body = await read_body(state, request)
    value = body.get("reward")
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProxyError(400, "'reward' must be a number", param="reward")
    components = body.get("components") or {}
    if not isinstance(components, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in components.values()
    ):
        raise ProxyError(400, "'components' must map names to numbers", param="components")
    event = RewardEvent(
        event_id=str(body.get("event_id") or f"rw_{uuid.uuid4().hex}"),
        rollout_id=rollout_id,
        reward=float(value),
        at_us=now_us(),
        task_id=body.get("task_id") or (rollout.task_id if rollout else None),
        components={str(k): float(v) for k, v in components.items()},
        verifier=body.get("verifier"),
        verifier_output=body.get("verifier_output"),
    )
    state.publisher.publish([event])
    return JSONResponse({"event_id": event.event_id, "rollout_id": rollout_id}, status_code=201)


def _opt_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ProxyError(400, f"'{name}' must be a string", param=name)
    return value


async def create_rollout(state: ProxyState, request: Request) -> Response:
    _admin(state, request)
    body = await read_body(state, request) if await request.body() else {}
    rollout_id = _opt_str(body, "rollout_id") or f"ro-{uuid.uuid4().hex[:16]}"
    if "/" in rollout_id or not rollout_id.strip():
        raise ProxyError(
            400, "'rollout_id' must be non-empty and contain no '/'", param="rollout_id"
        )
    if state.rollouts.get(rollout_id) is not None:
        raise ProxyError(409, f"rollout {rollout_id!r} already exists", param="rollout_id")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ProxyError(400, "'metadata' must be an object", param="metadata")
    rollout = state.start_rollout(
        rollout_id,
        mint_key=bool(body.get("mint_key", True)),
        task_id=_opt_str(body, "task_id"),
        group_id=_opt_str(body, "group_id"),
        harness=_opt_str(body, "harness"),
        harness_version=_opt_str(body, "harness_version"),
        metadata={str(k): str(v) for k, v in metadata.items()},
    )
    return JSONResponse(
        {
            "rollout_id": rollout.rollout_id,
            "api_key": rollout.api_key,
            "openai_base_path": f"/rollout/{rollout.rollout_id}/v1",
            "anthropic_base_path": f"/rollout/{rollout.rollout_id}",
        },
        status_code=201,
    )


async def finish_rollout(state: ProxyState, request: Request) -> Response:
    _admin(state, request)
    rollout = state.rollouts.get(request.path_params["rollout_id"])
    if rollout is None:
        raise ProxyError(404, f"unknown rollout {request.path_params['rollout_id']!r}")
    body = await read_body(state, request) if await request.body() else {}
    try:
        phase = RolloutPhase(body.get("phase", "finished"))
    except ValueError:
        raise ProxyError(
            400, "'phase' must be finished, failed or timed_out", param="phase"
        ) from None
    exit_code = body.get("exit_code")
    at = now_us()
    state.publisher.publish(
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
                backend=_opt_str(body, "backend"),
                exit_code=exit_code if isinstance(exit_code, int) else None,
                duration_s=(at - rollout.created_us) / 1e6,
                message=_opt_str(body, "message"),
                metadata=rollout.metadata,
            )
        ]
    )
    rollout.finished = True
    for thread in rollout.tracker.threads:
        state.encoder.forget(thread.thread_id)
    return JSONResponse({"rollout_id": rollout.rollout_id, "phase": phase.value})


async def policy(state: ProxyState, request: Request) -> Response:
    if request.method == "POST":
        _admin(state, request)
        body = await read_body(state, request)
        version = body.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise ProxyError(400, "'version' must be an integer", param="version")
        state.policy_version = version
        state.metrics.policy_version.set(version)
    return JSONResponse(
        {
            "version": state.policy_version,
            "paused": not state.resume.is_set(),
            "in_flight": state.in_flight,
        }
    )


async def pause(state: ProxyState, request: Request) -> Response:
    _admin(state, request)
    state.resume.clear()
    return JSONResponse({"paused": True, "in_flight": state.in_flight})


async def resume(state: ProxyState, request: Request) -> Response:
    _admin(state, request)
    state.resume.set()
    return JSONResponse({"paused": False, "in_flight": state.in_flight})


async def health(state: ProxyState, request: Request) -> Response:
    stats = state.publisher.stats
    return JSONResponse(
        {
            "status": "ok",
            "rollouts": len(state.rollouts),
            "events": {
                "published": stats.published,
                "spooled": stats.spooled,
                "pending": state.publisher.pending,
            },
        }
    )


async def metrics(state: ProxyState, request: Request) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def routes() -> list[Route]:
    out = []
    for prefix in ("/rollout/{rollout_id}", ""):
        out += [
            Route(f"{prefix}/v1/chat/completions", _completion(Dialect.CHAT), methods=["POST"]),
            Route(f"{prefix}/v1/responses", _completion(Dialect.RESPONSES), methods=["POST"]),
            Route(f"{prefix}/v1/messages", _completion(Dialect.MESSAGES), methods=["POST"]),
            Route(f"{prefix}/v1/messages/count_tokens", _guard(count_tokens), methods=["POST"]),
            Route(f"{prefix}/v1/models", _guard(models), methods=["GET"]),
        ]
    return [
        *out,
        Route("/rollout/{rollout_id}/reward", _guard(reward), methods=["POST"]),
        Route("/admin/rollouts", _guard(create_rollout), methods=["POST"]),
        Route("/admin/rollouts/{rollout_id}/finish", _guard(finish_rollout), methods=["POST"]),
        Route("/admin/policy", _guard(policy), methods=["GET", "POST"]),
        Route("/admin/pause", _guard(pause), methods=["POST"]),
        Route("/admin/resume", _guard(resume), methods=["POST"]),
        Route("/health", _guard(health), methods=["GET"]),
        Route("/metrics", _guard(metrics), methods=["GET"]),
    ]


async def discover(config: ProxyConfig) -> tuple[str, Path, int]:
    """Upstream model name, tokenizer directory and context length, from the settings or
    the upstream's ``/v1/models``."""
    info: dict[str, Any] = {}
    if config.upstream_model is None or config.tokenizer is None or config.max_model_len is None:
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                resp = await client.get(f"{config.upstream_url.rstrip('/')}/v1/models")
                resp.raise_for_status()
                data = resp.json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"cannot list models at {config.upstream_url}/v1/models: {exc}. "
                "Is the upstream running? Or pass --model and --tokenizer."
            ) from exc
        if config.upstream_model is not None:
            data = [m for m in data if m.get("id") == config.upstream_model] or data
        info = data[0] if data else {}
    model = config.upstream_model or info.get("id")
    tokenizer = config.tokenizer or (Path(info["root"]) if info.get("root") else None)
    if not model or tokenizer is None or not tokenizer.is_dir():
        raise ConfigError(
            "cannot tell the upstream model or its tokenizer directory: pass "
            "--model NAME and --tokenizer DIR"
        )
    return model, tokenizer, int(config.max_model_len or info.get("max_model_len") or 4096)


def create_app(config: ProxyConfig) -> Starlette:
    """The proxy app; services (upstream client, publisher) start in its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        model, tokenizer, max_len = await discover(config)
        renderer = Renderer(tokenizer)
        metrics_ = ProxyMetrics()
        upstream: Upstream
        if config.upstream_kind == "generate":
            upstream = GenerateUpstream(
                config.upstream_url, model, renderer.decode_text, timeout=config.upstream_timeout
            )
        elif config.upstream_kind == "completions":
            upstream = CompletionsUpstream(
                config.upstream_url, model, timeout=config.upstream_timeout
            )
        else:
            raise ConfigError(
                f"unknown upstream kind {config.upstream_kind!r}: use completions or generate"
            )
        publisher = Publisher(
            lambda: open_writer(config.log_url), config.spool_dir, on_publish=metrics_.on_publish
        )
        app.state.proxy = ProxyState(
            config, renderer, upstream, publisher, max_len, metrics=metrics_
        )
        # Move everything loaded so far (torch, transformers, ...) out of the cyclic collector's
        # reach: full collections over millions of start-up objects stalled requests ~200 ms.
        gc.freeze()
        try:
            yield
        finally:
            await upstream.aclose()
            publisher.close()

    return Starlette(routes=routes(), lifespan=lifespan)
