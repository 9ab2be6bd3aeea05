"""Rewards: a RewardEvent for a rollout, from the admin or the feedback credential.

    POST /rollout/{rollout_id}/reward         record a RewardEvent (also after the rollout ends)
    POST /sessions/{session}/reward           the same, to an open-mode session's rollout
    POST /responses/{response_id}/reward      the same, to the rollout that answered with that
                                              id (``chatcmpl-``, ``resp_``, ``msg_``)

Body: ``{"reward": R, "components": {...}, "verifier": ..., "verifier_output": ...,
"task_id": ..., "event_id": ...}``; the same object may ride on a verified phase
(:mod:`proxy.phases`). A rollout's own key is refused (:mod:`proxy.credentials`): the agent
cannot score itself.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.admin_fields import body_of, finite_number, opt_str
from proxy.attribution import request_key
from proxy.credentials import check_feedback
from proxy.errors import ProxyError
from proxy.recording import now_us
from proxy.response_ids import rollout_of
from proxy.rollouts import FinishedRollout, Rollout
from proxy.state import ProxyState
from schemas.reward import RewardEvent


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


def reward_event(
    body: dict[str, Any],
    rollout_id: str,
    known: Rollout | FinishedRollout | None,
    who: str = "admin",
    param: str = "",
) -> RewardEvent:
    """The RewardEvent ``body`` describes for ``rollout_id`` (``known``: the proxy's rollout of
    that id, which names its task); a bad field is a 400 naming it (``param``: its prefix,
    when the body is nested)."""
    value = body.get("reward")
    if not isinstance(value, int | float) or not finite_number(value):
        raise ProxyError(400, f"'{param}reward' must be a finite number", param=f"{param}reward")
    components = body.get("components") or {}
    if not isinstance(components, dict) or not all(finite_number(v) for v in components.values()):
        raise ProxyError(
            400,
            f"'{param}components' must map names to finite numbers",
            param=f"{param}components",
        )
    for name in ("verifier", "verifier_output", "task_id", "event_id"):
        opt_str(body, name)
    return RewardEvent(
        event_id=str(body.get("event_id") or f"rw_{uuid.uuid4().hex}"),
        rollout_id=rollout_id,
        reward=float(value),
        at_us=now_us(),
        task_id=body.get("task_id") or (known.task_id if known else None),
        components={str(k): float(v) for k, v in components.items()},
        verifier=body.get("verifier") or ("feedback" if who == "feedback" else None),
        verifier_output=body.get("verifier_output"),
    )


async def _reward(state: ProxyState, request: Request, rollout_id: str, who: str) -> Response:
    known = state.rollouts.get(rollout_id) or state.rollouts.finished(rollout_id)
    event = reward_event(await body_of(state, request), rollout_id, known, who)
    state.recorder.check()
    await state.recorder.durable(state.recorder.reward(event, known))
    return JSONResponse({"event_id": event.event_id, "rollout_id": rollout_id}, status_code=201)
