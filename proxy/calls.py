"""One call: attribute, translate, generate upstream, answer (streamed or not), record.

Streams are answered as the upstream streams (time to first token is kept), but the response
headers wait for the upstream's first chunk, so an upstream error keeps its HTTP status and
``Retry-After``. A client that goes away mid-stream aborts the upstream request; the partial
generation is recorded with status ``client_disconnected``. The slot, the completion event and
the metrics are the :class:`~proxy.lifecycle.CallLifecycle`'s, whose exit runs once per call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy import faults
from proxy.attribution import attribute, read_body
from proxy.dialects.base import Dialect, StreamEncoder, error_response
from proxy.errors import ProxyError
from proxy.faults import StreamCut
from proxy.generation import Delta, GenerationStream
from proxy.lifecycle import CallLifecycle
from proxy.recording import now_us
from proxy.state import ProxyState
from proxy.toolparse import TextDelta
from schemas.faults import FaultKind

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class CallStream(StreamingResponse):
    """An SSE response that owns the rest of its call's lifecycle: when the response ends (the
    last byte, a disconnect, an error), it closes the body and runs the lifecycle's exit.

    It streams in the request's own task; one small task waits for the client's disconnect and
    cancels the stream (instead of Starlette's task group and cancel scopes per response)."""

    def __init__(self, body: AsyncGenerator[bytes, None], exit_: contextlib.AsyncExitStack):
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._body, self._exit = body, exit_

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            async with self._exit:
                try:
                    start = {"type": "http.response.start", "status": self.status_code}
                    await send({**start, "headers": self.raw_headers})
                    async for chunk in self._body:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except StreamCut:
                    pass  # an injected fault: the server closes the connection mid-stream
                finally:
                    await self._body.aclose()
        except asyncio.CancelledError:
            if not gone.is_set():
                raise  # the server's cancellation, not the client's disconnect
            task.uncancel()
        finally:
            watcher.cancel()


def _encode(encoder: StreamEncoder, delta: Delta) -> bytes:
    if isinstance(delta, TextDelta):
        return encoder.text(delta.text)
    return encoder.tool_call(delta.call)


async def _sse(
    lifecycle: CallLifecycle,
    generation: GenerationStream,
    first: list[Delta],
    cut_after: int | None = None,
) -> AsyncGenerator[bytes, None]:
    """The answer as SSE; an upstream error after the headers becomes an in-band error event,
    and so does a record that is not durable in time (the stream never ends as if complete).
    With ``cut_after``, the stream is cut after that many chunks (an injected fault)."""
    dialect, req = lifecycle.dialect, lifecycle.req
    encoder = dialect.stream(req, lifecycle.meta, generation.gen.prompt_tokens)
    try:
        yield encoder.start() + b"".join(_encode(encoder, delta) for delta in first)
        sent = 1
        async for deltas in generation.rest():  # one write per upstream chunk, not per delta
            if cut_after is not None and sent >= cut_after:
                raise await faults.cut(lifecycle, sent)
            yield b"".join(_encode(encoder, delta) for delta in deltas)
            sent += 1
        last = encoder.finish(generation.gen)
        lifecycle.complete()
    except ProxyError as exc:
        lifecycle.fail(exc)
        last = dialect.stream_error(exc)
    try:
        await lifecycle.seal()  # the last bytes wait until the call's record is durable
    except ProxyError as exc:
        last = dialect.stream_error(exc)
    yield last


async def handle(state: ProxyState, request: Request, dialect: Dialect) -> Response:
    """Answer one call in ``dialect``; every error is a response in that dialect."""
    received = now_us()
    try:
        rollout = attribute(state, request)
        body = await read_body(state, request)
        if rollout.session is not None and state.rollouts.get(rollout.rollout_id) is None:
            rollout = attribute(state, request)  # its session ended while the body came in
        req = dialect.parse(body)
    except ProxyError as exc:
        state.metrics.count_rejected(dialect.name.value, exc.status)
        return error_response(exc, dialect)
    lifecycle = CallLifecycle(state, dialect, rollout, req, body, received)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(lifecycle)
            generation = await lifecycle.begin()
            fault = await faults.draw(state, lifecycle) if state.config.faults else None
            first = await generation.first()  # upstream errors surface here, before any byte
            lifecycle.answered(200)
            if req.stream:
                cut_after = _cut_after(state) if fault is FaultKind.STREAM_CUT else None
                sse = _sse(lifecycle, generation, first, cut_after)
                return CallStream(sse, stack.pop_all())
            async for _ in generation.rest():
                pass
            answer = dialect.respond(generation.gen, req, lifecycle.meta)
            lifecycle.complete(answer)
            return JSONResponse(answer)
    except ProxyError as exc:
        return error_response(exc, dialect)


def _cut_after(state: ProxyState) -> int:
    assert state.config.faults is not None
    return max(1, state.config.faults.cut_after_chunks)
