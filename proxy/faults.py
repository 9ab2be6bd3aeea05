"""Faults injected into calls on purpose (:mod:`schemas.faults`), where the proxy answers.

A call's fault is drawn once it has its index (:func:`draw`). A refusal (500, 503, 429) is
raised before the engine is asked for anything; a slow first byte waits before the engine's
first chunk is read; a stream cut ends a streamed answer after the plan's number of chunks,
the call recorded first (:func:`cut`), then the connection closed without the stream's end.
The call's completion event names the fault (``fault``) whenever it fired, and its status says
how it ended (``upstream_error`` for a refusal or a cut, ``ok`` for a slow first byte).
"""

from __future__ import annotations

import asyncio
import contextlib

from proxy.errors import ProxyError
from proxy.lifecycle import CallLifecycle
from proxy.state import ProxyState
from schemas.faults import REFUSALS, FaultKind


class StreamCut(Exception):
    """A streamed answer cut on purpose: the response ends without its last bytes."""


async def draw(state: ProxyState, lifecycle: CallLifecycle) -> FaultKind | None:
    """The fault of this numbered call, applied up to the engine's first chunk: a refusal is
    raised, a slow first byte waited out; a stream cut is returned for the stream to apply."""
    plan = state.config.faults
    ctx = lifecycle.ctx
    if plan is None or ctx is None:
        return None
    kind = plan.pick(ctx.rollout.rollout_id, ctx.call_index, lifecycle.req.stream)
    if kind is None or kind is FaultKind.STREAM_CUT:
        return kind
    ctx.fault = kind
    if kind in REFUSALS:
        raise refusal(kind, plan.retry_after_s)
    await asyncio.sleep(plan.delay_s)  # slow_first_byte
    return kind


def refusal(kind: FaultKind, retry_after_s: int) -> ProxyError:
    """The error an injected refusal answers with, as the model server would."""
    status = REFUSALS[kind]
    limited = status == 429
    return ProxyError(
        status,
        f"the model server answered {status} (an injected fault, {kind}): retry the request"
        + (f" after {retry_after_s} s" if status in (429, 503) else ""),
        code="rate_limit_exceeded" if limited else "server_error",
        retry_after=str(retry_after_s) if status in (429, 503) else None,
    )


async def cut(lifecycle: CallLifecycle, chunks: int) -> StreamCut:
    """Settle the call as cut after ``chunks`` chunks and record it (durably, as a completed
    stream would be); the exception that then ends the response."""
    assert lifecycle.ctx is not None
    lifecycle.ctx.fault = FaultKind.STREAM_CUT
    lifecycle.fail(ProxyError(502, f"the stream was cut after {chunks} chunks (an injected fault)"))
    with contextlib.suppress(ProxyError):  # not durable in time: the stream is cut all the same
        await lifecycle.seal()
    return StreamCut()
