"""The records the proxy makes, and what of them is redacted.

One ended call becomes its completion event in delta form (:func:`completion_event`); a rollout's
lifecycle change becomes a RolloutEvent (:func:`rollout_event`). Redacted (the
:class:`~proxy.redaction.Redactor`'s secrets, and the rollout's own key): a completion event's
request and response bodies, ``model``, ``error`` and stop strings, as it is built (the request
body in its delta form); a rollout event's ``message`` and metadata values and a reward event's
``verifier_output`` (:func:`redacted`). Token ids, logprobs and policy-version spans are never
changed. :class:`proxy.recorder.Recorder` makes and publishes them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from infra.image_store import ImageStore
from proxy.canonical import CallRequest, Generation
from proxy.continuity import Plan
from proxy.images import image_ids, recorded_body
from proxy.redaction import Redactor
from proxy.rollouts import FinishedRollout, Rollout
from schemas.codec import RolloutRecord
from schemas.completion import CompletionEvent, PolicySpan, SamplingParams, Timings, Usage
from schemas.delta import HISTORY_KEYS, HistoryDelta, PromptDelta, Scrub, dump_json
from schemas.enums import CompletionStatus, Dialect, RolloutPhase
from schemas.faults import FaultKind
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent


def now_us() -> int:
    """Now, in microseconds since the Unix epoch (the records' clock)."""
    return time.time_ns() // 1000


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
    fault: FaultKind | None = None  # injected into this call on purpose (schemas.faults)


def own_secrets(rollout: Rollout | FinishedRollout | None) -> tuple[str, ...]:
    """The secrets of one rollout, redacted beside the redactor's own: its key."""
    return (rollout.api_key,) if rollout is not None and rollout.api_key else ()


# --- completion events ------------------------------------------------------------------------


def completion_event(
    ctx: CallContext,
    gen: Generation,
    record_bodies: bool,
    redactor: Redactor | None = None,
    images: ImageStore | None = None,
) -> CompletionEvent:
    """The call's completion event. Advances the rollout's delta state (its thread's latest
    call becomes this one), so build exactly one event per call, in the rollout's call order
    per thread.

    With a ``redactor``, the text fields (bodies, model, error, stop strings) are redacted
    (the rollout's own key among the secrets); token ids and logprobs are never touched.
    ``redacted`` is true when the bodies were left out or anything was redacted.

    A call with images (an engine-rendered one) has each image's bytes stored in ``images``
    and referenced from the recorded body (:func:`proxy.images.recorded_body`); the event lists
    their hashes either way. Without a store, such a body is left out (``redacted``). Pixels are
    never redacted: ``--no-bodies`` is how to keep them out of the records."""
    active = redactor if redactor is not None and redactor.active else None
    before = sum(redactor.counts.values()) if redactor is not None else 0
    secrets = own_secrets(ctx.rollout)
    if ctx.plan.engine:
        record_bodies = record_bodies and images is not None
    body = ctx.body if record_bodies else None
    if body is not None and ctx.plan.engine and images is not None:
        body = recorded_body(body, images)
    prompt, history = ctx.rollout.delta(
        ctx.plan,
        ctx.event_id,
        ctx.req.dialect,
        gen.token_ids,
        body,
        _request_scrub(active, secrets, ctx.req.dialect),
    )
    response = None
    if record_bodies and ctx.response_body is not None:
        # An answer's fields are new each call: walked, not remembered (see Redactor.body).
        answer = ctx.response_body
        response = dump_json(active.json(answer, secrets) if active is not None else answer)
    sampling = _redacted_sampling(ctx.req.sampling, active, secrets)
    model = _text(ctx.req.model, active, secrets) or ""
    error = _text(ctx.error, active, secrets)
    removed = redactor is not None and sum(redactor.counts.values()) > before
    return _completion(
        ctx,
        gen,
        prompt,
        history,
        model=model,
        sampling=sampling,
        error=error,
        response=response,
        redacted=not record_bodies or removed,
    )


def _request_scrub(
    active: Redactor | None, secrets: Sequence[str], dialect: Dialect
) -> Scrub | None:
    """How the request body is redacted in its delta form (its fields repeat, see
    :meth:`Redactor.body`; the history's new items are walked); None: not redacted."""
    if active is None:
        return None
    fresh = HISTORY_KEYS[dialect]

    def scrub(body: dict[str, Any]) -> dict[str, Any]:
        return active.body(body, secrets, fresh=fresh)

    return scrub


def _text(value: str | None, active: Redactor | None, secrets: Sequence[str]) -> str | None:
    if active is None or value is None:
        return value
    return active.text(value, secrets)


def _redacted_sampling(
    sampling: SamplingParams, active: Redactor | None, secrets: Sequence[str]
) -> SamplingParams:
    """The sampling parameters with their stop strings redacted."""
    if active is None or not sampling.stop:
        return sampling
    return SamplingParams(
        sampling.temperature,
        sampling.top_p,
        sampling.top_k,
        sampling.max_tokens,
        sampling.seed,
        [active.text(s, secrets) for s in sampling.stop],
    )


def _completion(
    ctx: CallContext,
    gen: Generation,
    prompt: PromptDelta,
    history: HistoryDelta | None,
    *,
    model: str,
    sampling: SamplingParams,
    error: str | None,
    response: str | None,
    redacted: bool,
) -> CompletionEvent:
    """The event from the call and its already redacted parts."""
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
        prompt_ref_event_id=prompt.ref_event_id,
        prompt_ref_tokens=prompt.ref_tokens,
        prompt_token_ids=prompt.suffix,
        prompt_length=len(ctx.plan.prompt_ids),
        completion_token_ids=list(gen.token_ids),
        completion_logprobs=list(gen.logprobs),
        policy_versions=[PolicySpan(version, 0, n)] if n else [],
        finish_reason=gen.finish_reason,
        usage=Usage(len(ctx.plan.prompt_ids), n),
        error=error,
        retry_of=ctx.plan.retry_of,
        side_call=ctx.plan.thread.side_call,
        continuity=ctx.plan.continuity,
        request_history_ref=history.ref_event_id if history else None,
        request_history_prefix=history.prefix if history else 0,
        request_body=history.body_json if history else None,
        response_body=response,
        redacted=redacted,
        image_ids=image_ids(ctx.req.messages) if ctx.plan.engine else [],
        fault=None if ctx.fault is None else ctx.fault.value,
    )


# --- rollout lifecycle and rewards ------------------------------------------------------------


def rollout_event(rollout_id: str, phase: RolloutPhase, at_us: int, **fields: Any) -> RolloutEvent:
    """The event of a rollout reaching ``phase``. Its id names the rollout and the phase, so
    the same phase recorded twice is one event to consumers (they deduplicate by event id)."""
    return RolloutEvent(
        event_id=f"ro_{rollout_id}_{phase.value}",
        rollout_id=rollout_id,
        phase=phase,
        at_us=at_us,
        **fields,
    )


def described(rollout: Rollout) -> dict[str, Any]:
    """What the proxy's own lifecycle events of a live rollout say about it."""
    return {
        "task_id": rollout.task_id,
        "group_id": rollout.group_id,
        "harness": rollout.harness,
        "harness_version": rollout.harness_version,
        "metadata": rollout.metadata,
    }


def redacted(record: RolloutRecord, redactor: Redactor, secrets: Sequence[str]) -> RolloutRecord:
    """A rollout event with its message and metadata values redacted, a reward event with its
    verifier output redacted; any other record as it is."""
    text = redactor.text
    if isinstance(record, RolloutEvent):
        return replace(
            record,
            message=text(record.message, secrets) if record.message else record.message,
            metadata={k: text(v, secrets) for k, v in record.metadata.items()},
        )
    if isinstance(record, RewardEvent) and record.verifier_output:
        return replace(record, verifier_output=text(record.verifier_output, secrets))
    return record
