"""The orchestrator's and trainer's routes: rollouts, rewards, policy version, pause, health.

    POST /admin/rollouts                      register a rollout, mint its key;
                                              ``"record": false``: serve its calls, publish
                                              nothing of it (no event, no episode)
    POST /admin/rollouts/{rollout_id}/finish  record its end (RolloutEvent); evicts it;
                                              a repeated finish answers the same, records nothing
    POST /admin/rollouts/{rollout_id}/phase   record an orchestrator phase: queued, verified,
                                              infra_failed (which also evicts a live rollout)
    POST /rollout/{rollout_id}/reward         record a RewardEvent (also after the rollout ends)
    POST /sessions/{session}/reward           the same, to an open-mode session's rollout
    POST /responses/{response_id}/reward      the same, to the rollout that answered with that
                                              id (``chatcmpl-``, ``resp_``, ``msg_``)
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
import math
import uuid
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.attribution import read_body, request_key
from proxy.credentials import check_admin, check_feedback
from proxy.errors import ProxyError
from proxy.recording import now_us
from proxy.response_ids import rollout_of
from proxy.state import ProxyState
from proxy.swap_state import forget_pause, remember, remember_pause
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import COSTS


def require_admin(state: ProxyState, request: Request) -> None:
    """401 unless the request carries the admin token (:mod:`proxy.credentials`)."""
    check_admin(state.config, request_key(request))


def _opt_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise ProxyError(400, f"'{name}' must be a string", param=name)
    return value


def _finite_number(value: object) -> bool:
    """A JSON number (not a bool) that is a finite float64."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer beyond float64
        return False


async def _optional_body(state: ProxyState, request: Request) -> dict[str, Any]:
    return await read_body(state, request, admin=True, optional=True)


async def _body(state: ProxyState, request: Request) -> dict[str, Any]:
    return await read_body(state, request, admin=True)


async def reward(state: ProxyState, request: Request) -> Response:
    """A reward for the rollout in the path, from the admin or the feedback credential (never
    the rollout's own key: the agent cannot score itself)."""
    who = check_feedback(state.config, request_key(request))
    return await _reward(state, request, request.path_params["rollout_id"], who)


async def session_reward(state: ProxyState, request: Request) -> Response:
    """A reward (late feedback) for an open-mode session: its live rollout, else its last
    ended one while the proxy remembers it; 404 otherwise (post by rollout id then)."""
    who = check_feedback(state.config, request_key(request))
    identity = request.path_params["session"]
    rollout_id = state.rollouts.latest_of_session(identity)
    if rollout_id is None:
        raise ProxyError(
            404,
            f"no rollout of session {identity!r} is live or remembered: post the reward to "
            "/rollout/{rollout_id}/reward (the session's rollouts carry metadata.session)",
            code="session_not_found",
        )
    return await _reward(state, request, rollout_id, who)


async def response_reward(state: ProxyState, request: Request) -> Response:
    """A reward (feedback) for the rollout whose call answered with the response id in the path
    (:mod:`proxy.response_ids`): any time later, whether or not the proxy remembers it."""
    who = check_feedback(state.config, request_key(request))
    response = request.path_params["response_id"]
    rollout_id = rollout_of(response)
    if rollout_id is None:
        raise ProxyError(
            404,
            f"{response!r} is not a response id this proxy answered with (chatcmpl-..., resp_..., "
            "msg_...): post the reward by rollout or session",
            code="response_not_found",
        )
    return await _reward(state, request, rollout_id, who)


async def _reward(state: ProxyState, request: Request, rollout_id: str, who: str) -> Response:
    live, done = state.rollouts.get(rollout_id), state.rollouts.finished(rollout_id)
    body = await _body(state, request)
    value = body.get("reward")
    if not isinstance(value, int | float) or not _finite_number(value):
        raise ProxyError(400, "'reward' must be a finite number", param="reward")
    components = body.get("components") or {}
    if not isinstance(components, dict) or not all(_finite_number(v) for v in components.values()):
        raise ProxyError(400, "'components' must map names to finite numbers", param="components")
    for name in ("verifier", "verifier_output", "task_id", "event_id"):
        _opt_str(body, name)
    event = RewardEvent(
        event_id=str(body.get("event_id") or f"rw_{uuid.uuid4().hex}"),
        rollout_id=rollout_id,
        reward=float(value),
        at_us=now_us(),
        task_id=body.get("task_id") or (live.task_id if live else done.task_id if done else None),
        components={str(k): float(v) for k, v in components.items()},
        verifier=body.get("verifier") or ("feedback" if who == "feedback" else None),
        verifier_output=body.get("verifier_output"),
    )
    state.recorder.check()
    await state.recorder.durable(state.recorder.reward(event, live or done))
    return JSONResponse({"event_id": event.event_id, "rollout_id": rollout_id}, status_code=201)


async def create_rollout(state: ProxyState, request: Request) -> Response:
    require_admin(state, request)
    body = await _optional_body(state, request)
    rollout_id = _opt_str(body, "rollout_id") or f"ro-{uuid.uuid4().hex[:16]}"
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
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ProxyError(400, "'metadata' must be an object", param="metadata")
    record = body.get("record", True)
    if not isinstance(record, bool):
        raise ProxyError(400, "'record' must be true or false", param="record")
    state.recorder.check()
    rollout = state.rollouts.create(
        rollout_id,
        mint_key=bool(body.get("mint_key", True)),
        task_id=_opt_str(body, "task_id"),
        group_id=_opt_str(body, "group_id"),
        harness=_opt_str(body, "harness"),
        harness_version=_opt_str(body, "harness_version"),
        metadata={str(k): str(v) for k, v in metadata.items()},
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
    body = await _optional_body(state, request)
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
    backend, message = _opt_str(body, "backend"), _opt_str(body, "message")
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


# Phases the orchestrator reports beside the proxy's own (started on registration, the agent's
# end on finish): before registration, after verification, and infrastructure failures.
ORCHESTRATOR_PHASES = (RolloutPhase.QUEUED, RolloutPhase.VERIFIED, RolloutPhase.INFRA_FAILED)


async def record_phase(state: ProxyState, request: Request) -> Response:
    """Record an orchestrator lifecycle phase of a rollout (known to the proxy or not yet)."""
    require_admin(state, request)
    rollout_id = request.path_params["rollout_id"]
    body = await _body(state, request)
    names = ", ".join(p.value for p in ORCHESTRATOR_PHASES)
    try:
        phase = RolloutPhase(str(body.get("phase")))
    except ValueError:
        raise ProxyError(400, f"'phase' must be one of {names}", param="phase") from None
    if phase not in ORCHESTRATOR_PHASES:
        raise ProxyError(400, f"'phase' must be one of {names}", param="phase")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ProxyError(400, "'metadata' must be an object", param="metadata")
    costs = _costs(body.get("costs"))
    live, done = state.rollouts.get(rollout_id), state.rollouts.finished(rollout_id)
    fields = {
        n: _opt_str(body, n) for n in ("task_id", "group_id", "harness", "backend", "message")
    }
    state.recorder.check()
    extra = {str(k): str(v) for k, v in metadata.items()}
    if live is not None and phase is RolloutPhase.INFRA_FAILED:
        await state.end(
            live, phase, backend=fields["backend"], message=fields["message"], metadata=extra
        )
        return JSONResponse({"rollout_id": rollout_id, "phase": phase.value}, status_code=201)
    receipt = state.recorder.phase(
        rollout_id,
        phase,
        live or done,
        task_id=fields["task_id"] or (live.task_id if live else done.task_id if done else None),
        group_id=fields["group_id"] or (live.group_id if live else None),
        harness=fields["harness"] or (live.harness if live else None),
        backend=fields["backend"],
        message=fields["message"],
        metadata=extra,
        costs=costs,
    )
    await state.recorder.durable(receipt)
    return JSONResponse({"rollout_id": rollout_id, "phase": phase.value}, status_code=201)


def _costs(value: object) -> dict[str, float]:
    """``costs``: an object of documented cost names (schemas.rollout.COSTS) to finite numbers
    of at least 0; absent or null is none."""
    if value is None:
        return {}
    names = ", ".join(COSTS)
    if not isinstance(value, dict):
        raise ProxyError(400, f"'costs' must be an object of {names} to numbers", param="costs")
    out: dict[str, float] = {}
    for name, number in value.items():
        if name not in COSTS:
            raise ProxyError(400, f"'costs' has {name!r}; known: {names}", param="costs")
        ok = isinstance(number, int | float) and not isinstance(number, bool)
        if not ok or not math.isfinite(number) or number < 0:
            raise ProxyError(
                400, f"'costs.{name}' must be a finite number >= 0, not {number!r}", param="costs"
            )
        out[name] = float(number)
    return out


async def policy(state: ProxyState, request: Request) -> Response:
    if request.method == "POST":
        require_admin(state, request)
        body = await _body(state, request)
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
    body = await _optional_body(state, request)
    timeout = body.get("timeout_s", state.config.pause_timeout)
    if not _finite_number(timeout) or not 0 < timeout <= 86_400:
        raise ProxyError(
            400, "'timeout_s' must be seconds, above 0 and at most 86400", param="timeout_s"
        )
    drain = body.get("drain_s")
    if drain is not None and (not _finite_number(drain) or not 0 <= drain <= 86_400):
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
