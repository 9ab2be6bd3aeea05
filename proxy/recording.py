"""Turn one ended call into its completion event (delta form) for the event log."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from proxy.canonical import CallRequest, Generation
from proxy.continuity import Plan
from proxy.redaction import Redactor
from proxy.rollouts import Rollout
from schemas.completion import CompletionEvent, PolicySpan, SamplingParams, Timings, Usage
from schemas.delta import HISTORY_KEYS, dump_json
from schemas.enums import CompletionStatus


def new_event_id() -> str:
    return f"ev_{uuid.uuid4().hex}"


@dataclass
class CallContext:
    """Everything known about one call, gathered as it runs."""

    event_id: str
    rollout: Rollout
    call_index: int
    req: CallRequest
    plan: Plan
    body: dict[str, Any]
    received_us: int
    policy_version: int
    first_token_us: int | None = None
    done_us: int | None = None
    status: CompletionStatus = CompletionStatus.OK
    error: str | None = None
    response_body: dict[str, Any] | None = None


def completion_event(
    ctx: CallContext, gen: Generation, record_bodies: bool, redactor: Redactor | None = None
) -> CompletionEvent:
    """The call's completion event. Advances the rollout's delta state (its thread's latest
    call becomes this one), so build exactly one event per call, in the rollout's call order
    per thread.

    With a ``redactor``, the text fields (bodies, model, error, stop strings) are redacted
    (the rollout's own key among the secrets); token ids and logprobs are never touched.
    ``redacted`` is true when the bodies were left out or anything was redacted."""
    prompt = ctx.plan.prompt_ids
    literals = (ctx.rollout.api_key,) if ctx.rollout.api_key else ()
    active = redactor is not None and redactor.active
    before = sum(redactor.counts.values()) if redactor is not None else 0

    def text(value: str | None) -> str | None:
        if redactor is None or not active or value is None:
            return value
        return redactor.text(value, literals)

    def scrub(body: dict[str, Any]) -> dict[str, Any]:  # a request body: its fields repeat
        assert redactor is not None
        return redactor.body(body, literals, fresh=HISTORY_KEYS[ctx.req.dialect])

    pdelta, hdelta = ctx.rollout.delta(
        ctx.plan,
        ctx.event_id,
        ctx.req.dialect,
        gen.token_ids,
        ctx.body if record_bodies else None,
        scrub if active else None,
    )
    response = None
    if record_bodies and ctx.response_body is not None:
        answer = ctx.response_body
        # An answer's fields are new each call: walked, not remembered (see Redactor.body).
        response = dump_json(redactor.json(answer, literals) if redactor and active else answer)
    sampling = ctx.req.sampling
    if active and sampling.stop:
        sampling = SamplingParams(
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.max_tokens,
            sampling.seed,
            [text(s) or "" for s in sampling.stop],
        )
    model, error = text(ctx.req.model) or "", text(ctx.error)
    removed = redactor is not None and sum(redactor.counts.values()) > before
    version = gen.policy_version if gen.policy_version is not None else ctx.policy_version
    n = len(gen.token_ids)
    return CompletionEvent(
        event_id=ctx.event_id,
        rollout_id=ctx.rollout.rollout_id,
        call_index=ctx.call_index,
        dialect=ctx.req.dialect,
        streamed=ctx.req.stream,
        model=model,
        timings=Timings(ctx.received_us, ctx.first_token_us, ctx.done_us),
        status=ctx.status,
        task_id=ctx.rollout.task_id,
        harness=ctx.rollout.harness,
        harness_version=ctx.rollout.harness_version,
        thread_id=ctx.plan.thread.thread_id,
        parent_event_id=ctx.plan.parent_event_id,
        sampling=sampling,
        prompt_ref_event_id=pdelta.ref_event_id,
        prompt_ref_tokens=pdelta.ref_tokens,
        prompt_token_ids=pdelta.suffix,
        prompt_length=len(prompt),
        completion_token_ids=list(gen.token_ids),
        completion_logprobs=list(gen.logprobs),
        policy_versions=[PolicySpan(version, 0, n)] if n else [],
        finish_reason=gen.finish_reason,
        usage=Usage(len(prompt), n),
        error=error,
        retry_of=ctx.plan.retry_of,
        side_call=ctx.plan.thread.side_call,
        continuity=ctx.plan.continuity,
        request_history_ref=hdelta.ref_event_id if hdelta else None,
        request_history_prefix=hdelta.prefix if hdelta else 0,
        request_body=hdelta.body_json if hdelta else None,
        response_body=response,
        redacted=not record_bodies or removed,
    )
