"""One call's lifecycle, with a single exit: slot, completion event and metrics.

``async with CallLifecycle(...)`` takes a concurrency slot on entry (waiting out, or refusing
during, a weight swap). Its exit, whatever ended the call (success, an upstream error, a refusal,
a client that went away, a bug), does exactly once and in this order: settle the call's status,
abort the upstream request if it still runs, record the completion event (if the call got as far
as a call index), count the call's metrics, release the slot.

A streamed answer outlives the handler that starts it: the handler hands the lifecycle's exit to
the response (:class:`proxy.calls.CallStream`), which runs it when the response ends.

The proxy-crash guarantee: a call whose response completed is recorded durably, so a SIGKILL of
the proxy loses no answered call. A non-streamed answer is sent only after the exit has waited
for the completion event's :class:`~proxy.publisher.Receipt` (flushed to the event log, the
spool or the dead-letter file); a stream's last bytes wait for it in :meth:`CallLifecycle.seal`.
A record not durable within ``record_timeout`` turns the answer into a 503 (in-band for a
stream) that the harness retries. Calls that had not completed when the proxy died (no full
answer sent) may be lost; a client that went away is recorded without waiting.

Statuses: the caller settles a call with :meth:`CallLifecycle.complete` (OK) or
:meth:`CallLifecycle.fail` (an upstream error: UPSTREAM_ERROR, or TIMEOUT for 408/504); a
prompt longer than the context is REJECTED by :meth:`CallLifecycle.begin`; a ProxyError that
leaves the ``async with`` unsettled is an upstream failure; anything else that leaves it
unsettled (cancellation, a disconnect, an exception) is CLIENT_DISCONNECTED.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from proxy.canonical import CallRequest, Generation
from proxy.dialects.base import Dialect, ResponseMeta
from proxy.errors import ProxyError
from proxy.generation import GenerationStream
from proxy.publisher import Receipt
from proxy.recording import CallContext, new_event_id, now_us
from proxy.response_ids import response_id
from proxy.rollouts import Rollout
from proxy.stages import Stage, Step, advance, exit_steps
from proxy.state import ProxyState
from schemas.enums import CompletionStatus


class CallLifecycle:
    """A call from admission to its completion event. Not reusable: one ``async with`` each.

    Its :attr:`stage` follows :mod:`proxy.stages`; a step out of order raises
    :class:`~proxy.stages.IllegalTransition`."""

    def __init__(
        self,
        state: ProxyState,
        dialect: Dialect,
        rollout: Rollout,
        req: CallRequest,
        body: dict[str, Any],
        received_us: int,
    ) -> None:
        self.state, self.dialect, self.rollout = state, dialect, rollout
        self.req, self.body, self.received_us = req, body, received_us
        self.stage = Stage.NEW
        self.ctx: CallContext | None = None  # set by begin(): the call has an index
        self.generation: GenerationStream | None = None  # set by begin(): it goes upstream
        self.meta = ResponseMeta(response_id(dialect.id_prefix, rollout.rollout_id), req.model)
        self._answered: int | None = None  # the HTTP status the harness gets

    async def __aenter__(self) -> CallLifecycle:
        admitted = advance(self.stage, Step.ADMIT)
        state = self.state
        self.rollout.enter()  # an open-mode session is not idle while a call waits or runs
        try:
            state.recorder.check()
            await state.gate.admit()
        except BaseException as exc:
            self.rollout.leave()
            if isinstance(exc, ProxyError):
                state.metrics.count_rejected(self.dialect.name.value, exc.status)
            raise
        self.stage = admitted
        return self

    async def begin(self) -> GenerationStream:
        """Number and plan the call, then open its generation upstream (lazily: nothing is
        sent before the first read). A prompt that leaves no room in the context is recorded
        as REJECTED and raised as a 400 ``context_length_exceeded``."""
        numbered = advance(self.stage, Step.NUMBER)
        state, req = self.state, self.req
        call_index, plan = await self.rollout.begin_call(req, state.renderer)
        self.ctx = CallContext(
            new_event_id(),
            self.rollout,
            call_index,
            req,
            plan,
            self.body,
            self.received_us,
            state.policy_version,
        )
        self.stage = numbered
        room = state.max_model_len - len(plan.prompt_ids)
        if room < 1:
            too_long = ProxyError(
                400,
                f"the prompt is {len(plan.prompt_ids)} tokens; the model's context is "
                f"{state.max_model_len}: shorten the conversation",
                code="context_length_exceeded",
            )
            self._settle(CompletionStatus.REJECTED, too_long.message)
            self.rollout.refused_too_long(len(plan.prompt_ids), state.max_model_len)
            raise too_long
        max_tokens = min(req.sampling.max_tokens or state.config.default_max_tokens, room)
        if state.config.max_tokens_cap is not None:
            max_tokens = min(max_tokens, state.config.max_tokens_cap)
        if plan.engine:  # images: the engine renders the prompt (proxy.upstream_chat)
            chunks = state.upstream.generate_chat(req.messages, req.tools, req.sampling, max_tokens)
        else:
            chunks = state.upstream.generate(plan.prompt_ids, req.sampling, max_tokens)
        self.generation = GenerationStream(chunks, len(plan.prompt_ids), self._first_token)
        return self.generation

    def answered(self, status: int) -> None:
        """The harness is answered with HTTP ``status`` (counted on exit)."""
        self._answered = status

    def complete(self, response_body: dict[str, Any] | None = None) -> None:
        """The call ended as it should; ``response_body`` is the answer sent (for a stream,
        None: the equivalent non-streamed body is recorded)."""
        ctx = self._settle(CompletionStatus.OK, None)
        ctx.response_body = response_body

    def fail(self, error: ProxyError) -> None:
        """The upstream failed: TIMEOUT for 408/504, else UPSTREAM_ERROR."""
        timeout = error.status in (408, 504)
        status = CompletionStatus.TIMEOUT if timeout else CompletionStatus.UPSTREAM_ERROR
        self._settle(status, error.message)
        self.state.metrics.errors.labels("upstream").inc()

    def _settle(self, status: CompletionStatus, error: str | None) -> CallContext:
        self.stage = advance(self.stage, Step.SETTLE)
        ctx = self.ctx
        assert ctx is not None  # numbered
        ctx.status, ctx.error = status, error
        return ctx

    async def seal(self) -> None:
        """Record the settled call now and wait until its record is durable (before a stream's
        last bytes); a 503 ProxyError if that takes longer than ``record_timeout``. The exit
        then records nothing more."""
        await self.state.recorder.durable(self._record())

    def _first_token(self) -> None:
        assert self.ctx is not None
        self.ctx.first_token_us = now_us()
        self.state.metrics.first_token.labels(self.dialect.name.value).observe(
            (self.ctx.first_token_us - self.received_us) / 1e6
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        steps = exit_steps(self.stage)  # what is left to do; raises if there is no slot
        try:
            if isinstance(exc, ProxyError):
                self._answered = exc.status  # the error response that follows
            if Step.SETTLE in steps:
                self._settle_unsettled(exc)
            late: ProxyError | None = None  # the record was not durable in time
            try:
                if self.generation is not None:
                    await self.generation.close()
            finally:
                if Step.RECORD in steps:
                    late = await self._record_on_exit()
                if self._answered is not None:
                    self.state.metrics.calls.labels(
                        self.dialect.name.value, str(self._answered)
                    ).inc()
            if late is not None:
                raise late  # answered instead of the call's own response
        finally:
            self.state.gate.release()
            self.rollout.leave()
            self.stage = advance(self.stage, Step.EXIT)

    def _settle_unsettled(self, exc: BaseException | None) -> None:
        """Settle a call that leaves unsettled: a ProxyError is an upstream failure, anything
        else (cancellation, a disconnect, an exception) a client that went away."""
        if isinstance(exc, ProxyError):
            self.fail(exc)
            return
        streaming = self.req.stream and self._answered is not None
        self._settle(
            CompletionStatus.CLIENT_DISCONNECTED,
            "client disconnected mid-stream" if streaming else None,
        )

    async def _record_on_exit(self) -> ProxyError | None:
        """Record the call; an answer not sent yet waits until its record is durable (the
        crash guarantee): the 503 to answer instead if it is not in time."""
        receipt = self._record()
        assert self.ctx is not None
        sent = self.req.stream and self._answered == 200
        gone = self.ctx.status is CompletionStatus.CLIENT_DISCONNECTED
        if sent or gone:
            return None
        try:
            await self.state.recorder.durable(receipt)
        except ProxyError as error:
            self._answered = error.status
            return error
        return None

    def _record(self) -> Receipt:
        """Publish the completion event, advance the rollout's continuity, count tokens."""
        self.stage = advance(self.stage, Step.RECORD)
        ctx, state = self.ctx, self.state
        assert ctx is not None  # settled
        gen = (
            self.generation.gen
            if self.generation
            else Generation(prompt_tokens=len(ctx.plan.prompt_ids))
        )
        ctx.done_us = now_us()
        if ctx.plan.engine:  # the prompt the engine rendered, checked against the thread
            ctx.plan.settle_engine_prompt(gen.engine_prompt_ids or [])
        if ctx.status is CompletionStatus.OK and ctx.response_body is None:
            ctx.response_body = self.dialect.respond(gen, ctx.req, self.meta)
        event, receipt = state.recorder.call(ctx, gen)
        self.rollout.commit(ctx.plan, ctx.event_id, ctx.req, gen, ctx.status)
        m = state.metrics
        m.tokens.labels("prompt").inc(len(ctx.plan.prompt_ids))
        m.tokens.labels("completion").inc(len(gen.token_ids))
        if not ctx.plan.rendered:
            m.tokens.labels("reused").inc(event.prompt_ref_tokens)
        m.continuity.labels(ctx.plan.continuity.value).inc()
        m.latency.labels(ctx.req.dialect.value, str(ctx.req.stream).lower()).observe(
            (ctx.done_us - ctx.received_us) / 1e6
        )
        return receipt
