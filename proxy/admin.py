"""The orchestrator's and trainer's routes: rollouts, policy version, pause, health (the
orchestrator's phases: :mod:`proxy.phases`; rewards: :mod:`proxy.rewards`).

    POST /admin/rollouts                      register a rollout, mint its key;
                                              ``"record": false``: serve its calls, publish
                                              nothing of it (no event, no episode)
    POST /admin/rollouts/{rollout_id}/finish  record its end (RolloutEvent); evicts it;
                                              a repeated finish answers the same, records nothing
    GET|POST /admin/policy                    read or set the policy version
    POST /admin/pause, /admin/resume          gate new calls during a weight swap; a pause
                                              ends by itself after ``{"timeout_s": N}`` or
                                              the configured ``pause_timeout`` (and says so);
                                              ``{"drain_s": D}`` also waits for the calls in
                                              flight to end (``in_flight`` 0 in the answer)
    GET  /health, /metrics                    /health is 503 while calls cannot be recorded

``/admin/*`` and rewards need the admin token (:mod:`proxy.credentials`); a rollout's own key
is refused there, so an agent cannot score itself. Each handler takes the state and the request
and raises ProxyError for a bad request (the app renders it). Admin bodies are held to
``max_admin_body_bytes``. A route that records answers only once its own record is durable (its
receipt, not everything published before it), 503 if that takes longer than ``record_timeout``,
and 503 while the publisher cannot record (as calls do), before anything changes.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.admin_fields import body_of, finite_number, opt_str, optional_body, str_map
from proxy.attribution import request_key
from proxy.credentials import check_admin
from proxy.errors import ProxyError
from proxy.state import ProxyState
from proxy.swap_state import forget_pause, remember, remember_pause
from schemas.enums import RolloutPhase


def require_admin(state: ProxyState, request: Request) -> None:
    """401 unless the request carries the admin token (:mod:`proxy.credentials`)."""
    check_admin(state.config, request_key(request))


async def create_rollout(state: ProxyState, request: Request) -> Response:
    require_admin(state, request)
    body = await optional_body(state, request)
    rollout_id = opt_str(body, "rollout_id") or f"ro-{uuid.uuid4().hex[:16]}"
    if "/" in rollout_id or not rollout_id.strip():
        raise ProxyError(
            400, "'rollout_id' must be non-empty and contain no '/'", param="rollout_id"
        )
    if state.rollouts.get(rollout_id) is not None:
        raise ProxyError(409, f"rollout {rollout_id!r} already exists", param="rollout_id")
    if state.rollouts.finished(rollout_id) is not None:
        raise ProxyError(
            409, f"rollout {rollout_id!r} already ran: pick a new id", param="rollout_id"
        )
    metadata = str_map(body, "metadata")
    record = body.get("record", True)
    if not isinstance(record, bool):
        raise ProxyError(400, "'record' must be true or false", param="record")
    state.recorder.check()
    rollout = state.rollouts.create(
        rollout_id,
        mint_key=bool(body.get("mint_key", True)),
        task_id=opt_str(body, "task_id"),
        group_id=opt_str(body, "group_id"),
        harness=opt_str(body, "harness"),
        harness_version=opt_str(body, "harness_version"),
        metadata=metadata,
        record=record,
    )
    await state.recorder.durable(state.recorder.started(rollout))
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
    require_admin(state, request)
    rollout_id = request.path_params["rollout_id"]
    rollout = state.rollouts.get(rollout_id)
    if rollout is None:
        done = state.rollouts.finished(rollout_id)
        if done is not None:  # a retried finish: answer as before, record nothing new
            again = {
                "rollout_id": rollout_id,
                "phase": done.phase.value,
                "calls": done.calls,
                "first_call_s": done.first_call_s,
            }
            return JSONResponse(again)
        raise ProxyError(404, f"unknown rollout {rollout_id!r}: register it first")
    body = await optional_body(state, request)
    try:
        phase = RolloutPhase(body.get("phase", "finished"))
    except ValueError:
        raise ProxyError(
            400, "'phase' must be finished, failed or timed_out", param="phase"
        ) from None
    raw_code = body.get("exit_code")
    exit_code: int | None = None  # an exit status fits int32; anything else is not one
    if (
        isinstance(raw_code, int)
        and not isinstance(raw_code, bool)
        and -(2**31) <= raw_code < 2**31
    ):
        exit_code = raw_code
    backend, message = opt_str(body, "backend"), opt_str(body, "message")
    state.recorder.check()
    await state.end(rollout, phase, backend=backend, exit_code=exit_code, message=message)
    answer: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "phase": phase.value,
        "calls": rollout.calls,
        "first_call_s": rollout.first_call_s,
    }
    if rollout.too_long is not None:  # the run's context is too short for this harness
        answer["too_long"] = {"prompt_tokens": rollout.too_long[0], "context": rollout.too_long[1]}
    return JSONResponse(answer)


async def policy(state: ProxyState, request: Request) -> Response:
    if request.method == "POST":
        require_admin(state, request)
        body = await body_of(state, request)
        version = body.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 2**63:
            raise ProxyError(400, "'version' must be an integer from 0 to 2^63-1", param="version")
        await asyncio.to_thread(remember, state.config.spool_dir, version)
        state.policy_version = version
    return JSONResponse(
        {
            "version": state.policy_version,
            **_pause_state(state),
        }
    )


def _pause_state(state: ProxyState) -> dict[str, Any]:
    gate = state.gate
    return {
        "paused": gate.paused,
        "resumes_in_s": gate.resumes_in(),
        "auto_resumes": gate.auto_resumes,
        "in_flight": gate.in_flight,
    }


async def pause(state: ProxyState, request: Request) -> Response:
    """Pause new calls; ``{"timeout_s": N}`` (default ``pause_timeout``) ends it by itself.
    ``{"drain_s": D}`` also waits, at most D seconds (and no longer than the pause lasts), until
    no call is in flight: the answer's ``in_flight`` is 0 once every call admitted before the
    pause has ended, and ``paused`` says the gate is still closed."""
    require_admin(state, request)
    body = await optional_body(state, request)
    timeout = body.get("timeout_s", state.config.pause_timeout)
    if not finite_number(timeout) or not 0 < timeout <= 86_400:
        raise ProxyError(
            400, "'timeout_s' must be seconds, above 0 and at most 86400", param="timeout_s"
        )
    drain = body.get("drain_s")
    if drain is not None and (not finite_number(drain) or not 0 <= drain <= 86_400):
        raise ProxyError(400, "'drain_s' must be seconds, from 0 to 86400", param="drain_s")
    await asyncio.to_thread(remember_pause, state.config.spool_dir, float(timeout))
    state.gate.pause(float(timeout))
    if drain is not None:
        await state.gate.drain(float(drain))
    return JSONResponse(_pause_state(state))


async def resume(state: ProxyState, request: Request) -> Response:
    require_admin(state, request)
    state.gate.unpause()
    await asyncio.to_thread(forget_pause, state.config.spool_dir)
    return JSONResponse(_pause_state(state))


async def health(state: ProxyState, request: Request) -> Response:
    """``ok`` (200), or 503 with the reason while new calls cannot be recorded in time."""
    problem = state.recorder.problem()
    return JSONResponse(
        {
            "status": "ok" if problem is None else "unavailable",
            "problem": problem,
            "rollouts": len(state.rollouts),
            "finished_rollouts": state.rollouts.finished_count,
            "events": state.recorder.counts(),
        },
        status_code=200 if problem is None else 503,
    )


async def metrics(state: ProxyState, request: Request) -> Response:
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
