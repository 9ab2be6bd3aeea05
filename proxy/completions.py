"""One completion call: attribute, translate, generate upstream, answer, record.

Streams are answered as the upstream streams (time to first token is kept), but the response
headers wait for the upstream's first chunk, so an upstream error keeps its HTTP status and
``Retry-After``. A client that goes away mid-stream aborts the upstream request; the partial
completion is recorded with status ``client_disconnected``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy.canonical import Generation
from proxy.dialects import ResponseMeta, chat, messages, new_id, responses
from proxy.errors import ProxyError, error_response, stream_error_event
from proxy.recording import CallContext, build_event, new_event_id
from proxy.rollouts import KEY_PREFIX, Rollout
from proxy.state import ProxyState, now_us
from proxy.toolparse import TextDelta, ToolCallStream
from proxy.upstream import Chunk
from schemas.enums import CompletionStatus, Dialect

log = logging.getLogger("openforge.proxy")
DIALECTS: dict[Dialect, Any] = {
    Dialect.CHAT: chat,
    Dialect.RESPONSES: responses,
    Dialect.MESSAGES: messages,
}
ID_PREFIX = {Dialect.CHAT: "chatcmpl-", Dialect.RESPONSES: "resp_", Dialect.MESSAGES: "msg_"}


def request_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def session_identity(request: Request, headers: list[str]) -> str | None:
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


def attribute(state: ProxyState, request: Request) -> Rollout:
    """The rollout this call records into, or a 401/403/404 ProxyError."""
    key = request_key(request)
    key_rollout = None
    if key and key.startswith(KEY_PREFIX):
        key_rollout = state.rollouts.by_key(key)
        if key_rollout is None:
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
            if not state.config.auto_register:
                raise ProxyError(
                    404,
                    f"unknown rollout {path_id!r}: register it with "
                    "POST /admin/rollouts (or start the proxy with --auto-register)",
                    code="rollout_not_found",
                )
            rollout = state.start_rollout(path_id, mint_key=False)
        if state.config.require_keys and rollout.api_key and key_rollout is None:
            raise ProxyError(401, "this rollout requires its key", code="invalid_api_key")
        return rollout
    if key_rollout is not None:
        return key_rollout
    if state.config.open_mode:
        session = session_identity(request, state.config.session_headers)
        if session:
            rollout_id = f"session-{session}"
            return state.rollouts.get(rollout_id) or state.start_rollout(rollout_id, mint_key=False)
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


async def read_body(state: ProxyState, request: Request) -> dict[str, Any]:
    limit = state.config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ProxyError(413, f"request body of {declared} bytes exceeds the {limit}-byte limit")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise ProxyError(413, f"request body exceeds the {limit}-byte limit")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProxyError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ProxyError(400, "request body must be a JSON object")
    return body


class Call:
    """A call in flight: generation, translation and recording."""

    def __init__(
        self, state: ProxyState, ctx: CallContext, max_tokens: int, meta: ResponseMeta
    ) -> None:
        self.state, self.ctx, self.max_tokens, self._meta = state, ctx, max_tokens, meta
        self.gen = Generation(prompt_tokens=len(ctx.plan.prompt_ids))
        self.parser = ToolCallStream()
        self.chunks: AsyncIterator[Chunk] = state.upstream.generate(
            ctx.plan.prompt_ids, ctx.req.sampling, max_tokens
        )
        self.recorded = False

    def _absorb(self, chunk: Chunk) -> list[Any]:
        if chunk.token_ids and self.ctx.first_token_us is None:
            self.ctx.first_token_us = now_us()
            self.state.metrics.first_token.labels(self.ctx.req.dialect.value).observe(
                (self.ctx.first_token_us - self.ctx.received_us) / 1e6
            )
        self.gen.token_ids += chunk.token_ids
        self.gen.logprobs += chunk.logprobs
        self.gen.text += chunk.text
        if chunk.finish_reason:
            self.gen.finish_reason = chunk.finish_reason
        if chunk.weight_version is not None:
            self.gen.weight_version = chunk.weight_version
        return list(self.parser.feed(chunk.text))

    def _close_parser(self) -> list[Any]:
        deltas = list(self.parser.close())
        self.gen.content, self.gen.tool_calls = self.parser.content, list(self.parser.calls)
        return deltas

    async def first(self) -> list[Any]:
        """Wait for the upstream's first chunk (errors surface here, before any byte is sent)."""
        try:
            chunk = await anext(self.chunks)
        except StopAsyncIteration:
            return self._close_parser()
        return self._absorb(chunk)

    async def rest(self) -> AsyncIterator[Any]:
        async for chunk in self.chunks:
            for delta in self._absorb(chunk):
                yield delta
            # Chunks the upstream already sent arrive without suspending; yield to the loop so
            # a client's disconnect is seen and other streams get their turn.
            await asyncio.sleep(0)
        for delta in self._close_parser():
            yield delta

    def record(self) -> None:
        if self.recorded:
            return
        self.recorded = True
        ctx, state = self.ctx, self.state
        ctx.done_us = now_us()
        if ctx.status is CompletionStatus.OK and ctx.response_body is None:
            ctx.response_body = DIALECTS[ctx.req.dialect].respond(self.gen, ctx.req, self._meta)
        event = build_event(ctx, self.gen, state.encoder, state.config.record_bodies)
        ctx.rollout.tracker.commit(ctx.plan, ctx.event_id, ctx.req, self.gen, ctx.status)
        state.publisher.publish([event])
        m = state.metrics
        m.tokens.labels("prompt").inc(len(ctx.plan.prompt_ids))
        m.tokens.labels("completion").inc(len(self.gen.token_ids))
        if not ctx.plan.rendered:
            m.tokens.labels("reused").inc(event.prompt_ref_tokens)
        m.continuity.labels(ctx.plan.continuity.value).inc()
        m.latency.labels(ctx.req.dialect.value, str(ctx.req.stream).lower()).observe(
            (ctx.done_us - ctx.received_us) / 1e6
        )

    def fail(self, error: ProxyError) -> None:
        self.ctx.status = (
            CompletionStatus.TIMEOUT
            if error.status in (408, 504)
            else CompletionStatus.UPSTREAM_ERROR
        )
        self.ctx.error = error.message
        self.state.metrics.errors.labels("upstream").inc()


async def handle(state: ProxyState, request: Request, dialect: Dialect) -> Response:
    received = now_us()
    try:
        rollout = attribute(state, request)
        body = await read_body(state, request)
        req = DIALECTS[dialect].parse(body)
        await state.admit()
    except ProxyError as exc:
        state.metrics.requests.labels(dialect.value, str(exc.status)).inc()
        state.metrics.errors.labels("rejected").inc()
        return error_response(exc, dialect)
    try:
        async with rollout.lock:
            call_index = rollout.take_call_index()
            plan = rollout.tracker.plan(req, state.renderer)
        ctx = CallContext(
            new_event_id(), rollout, call_index, req, plan, body, received, state.policy_version
        )
        room = state.max_model_len - len(plan.prompt_ids)
        max_tokens = min(req.sampling.max_tokens or state.config.default_max_tokens, room)
        if state.config.max_tokens_cap is not None:
            max_tokens = min(max_tokens, state.config.max_tokens_cap)
        call = Call(state, ctx, max_tokens, ResponseMeta(new_id(ID_PREFIX[dialect]), req.model))
        if room < 1:
            too_long = ProxyError(
                400,
                f"the prompt is {len(plan.prompt_ids)} tokens; the model's "
                f"context is {state.max_model_len}",
                code="context_length_exceeded",
            )
            ctx.status, ctx.error = CompletionStatus.REJECTED, too_long.message
            call.record()  # refused, but recorded: the call index stays accounted for
            raise too_long
    except ProxyError as exc:
        state.release()
        state.metrics.requests.labels(dialect.value, str(exc.status)).inc()
        return error_response(exc, dialect)
    except BaseException:
        state.release()
        raise
    try:
        first = await call.first()
    except ProxyError as exc:
        call.fail(exc)
        call.record()
        state.release()
        state.metrics.requests.labels(dialect.value, str(exc.status)).inc()
        return error_response(exc, dialect)
    except BaseException:
        ctx.status = CompletionStatus.CLIENT_DISCONNECTED
        call.record()
        state.release()
        raise
    state.metrics.requests.labels(dialect.value, "200").inc()
    if req.stream:
        return StreamingResponse(
            _stream(call, first),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    try:
        async for delta in call.rest():
            first.append(delta)
        ctx.response_body = DIALECTS[dialect].respond(call.gen, req, call._meta)
        return JSONResponse(ctx.response_body)
    except ProxyError as exc:
        call.fail(exc)
        return error_response(exc, dialect)
    except BaseException:
        ctx.status = CompletionStatus.CLIENT_DISCONNECTED
        raise
    finally:
        await call.chunks.aclose()  # type: ignore[attr-defined]
        call.record()
        state.release()


async def _stream(call: Call, first: list[Any]) -> AsyncIterator[bytes]:
    ctx = call.ctx
    encoder = DIALECTS[ctx.req.dialect].Stream(ctx.req, call._meta)

    def encode(delta: Any) -> bytes:
        if isinstance(delta, TextDelta):
            return bytes(encoder.text(delta.text))
        return bytes(encoder.tool_call(delta.call))

    try:
        if ctx.req.dialect is Dialect.MESSAGES:
            yield encoder.start(len(ctx.plan.prompt_ids))
        else:
            yield encoder.start()
        for delta in first:
            yield encode(delta)
        async for delta in call.rest():
            yield encode(delta)
        yield encoder.finish(call.gen)
    except ProxyError as exc:
        call.fail(exc)
        yield stream_error_event(exc, ctx.req.dialect)
    except (asyncio.CancelledError, GeneratorExit):
        ctx.status = CompletionStatus.CLIENT_DISCONNECTED
        ctx.error = "client disconnected mid-stream"
        raise
    finally:
        try:
            await call.chunks.aclose()  # type: ignore[attr-defined]
        finally:
            call.record()
            call.state.release()
