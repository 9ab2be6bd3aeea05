"""The orchestrator's phases of a rollout, beside the proxy's own (started on registration, the
agent's end on finish): before registration, after verification, infrastructure failures.

    POST /admin/rollouts/{rollout_id}/phase   record one phase: queued, verified, infra_failed
                                              (which also evicts a live rollout); a verified
                                              phase may carry the rollout's ``reward`` (the
                                              reward route's body, :mod:`proxy.rewards`): both
                                              recorded in one write, the answer naming the
                                              reward's ``event_id``
    POST /admin/rollouts/phases               ``{"phases": [{"rollout_id": R, "phase": P, ...}]}``:
                                              many queued or verified phases in one request
                                              (a run's queue), all checked before any is
                                              recorded, recorded in order in one write

Each phase's body: ``phase``; ``task_id``, ``group_id``, ``harness`` (else the proxy's own,
for a rollout it knows), ``backend``, ``message``, ``metadata`` (strings), ``costs``
(:data:`schemas.rollout.COSTS`). The proxy need not know the rollout yet. One write is one
publication to the event log and one wait for it to be durable: a run's admin calls per
rollout are its registration, its finish, and its verified phase with the reward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.admin_fields import body_of, opt_str, str_map
from proxy.attribution import request_key
from proxy.credentials import check_admin
from proxy.errors import ProxyError
from proxy.recorder import Known
from proxy.recording import now_us, rollout_event
from proxy.rewards import reward_event
from proxy.state import ProxyState
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import COSTS, RolloutEvent

ORCHESTRATOR_PHASES = (RolloutPhase.QUEUED, RolloutPhase.VERIFIED, RolloutPhase.INFRA_FAILED)
# In a batch: phases that only record (an infrastructure failure may end a live rollout).
BATCHED_PHASES = (RolloutPhase.QUEUED, RolloutPhase.VERIFIED)
FIELDS = ("task_id", "group_id", "harness", "backend", "message")


@dataclass
class PhaseReport:
    """One phase as the orchestrator reported it, checked."""

    rollout_id: str
    phase: RolloutPhase
    fields: dict[str, str | None]
    metadata: dict[str, str] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    reward: RewardEvent | None = None


async def record_phase(state: ProxyState, request: Request) -> Response:
    """Record an orchestrator lifecycle phase of a rollout (known to the proxy or not yet)."""
    check_admin(state.config, request_key(request))
    rollout_id = request.path_params["rollout_id"]
    report = parse(state, rollout_id, await body_of(state, request), ORCHESTRATOR_PHASES)
    state.recorder.check()
    live = state.rollouts.get(rollout_id)
    if live is not None and report.phase is RolloutPhase.INFRA_FAILED:
        await state.end(
            live,
            report.phase,
            backend=report.fields["backend"],
            message=report.fields["message"],
            metadata=report.metadata,
        )
    else:
        await state.recorder.durable(state.recorder.many(records(state, report)))
    return JSONResponse(_answer(report), status_code=201)


async def record_phases(state: ProxyState, request: Request) -> Response:
    """Record many queued or verified phases at once: every one checked first (a 400 names
    the first bad one, and nothing is recorded), then all in one write."""
    check_admin(state.config, request_key(request))
    body = await body_of(state, request)
    items = body.get("phases")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ProxyError(400, "'phases' must be a list of objects", param="phases")
    reports = []
    for n, item in enumerate(items):
        rollout_id = opt_str(item, "rollout_id")
        if not rollout_id:
            raise ProxyError(400, f"'phases[{n}].rollout_id' is missing", param="phases")
        reports.append(parse(state, rollout_id, item, BATCHED_PHASES, f"phases[{n}]."))
    state.recorder.check()
    await state.recorder.durable(
        state.recorder.many([r for report in reports for r in records(state, report)])
    )
    return JSONResponse({"phases": [_answer(r) for r in reports]}, status_code=201)


def parse(
    state: ProxyState,
    rollout_id: str,
    body: dict[str, Any],
    allowed: tuple[RolloutPhase, ...],
    where: str = "",
) -> PhaseReport:
    """The phase ``body`` reports for ``rollout_id``; a 400 naming the bad field (``where``:
    its place in a batch) unless it is one of ``allowed``, with well-formed fields."""
    names = ", ".join(p.value for p in allowed)
    try:
        phase = RolloutPhase(str(body.get("phase")))
    except ValueError:
        phase = None
    if phase not in allowed:
        raise ProxyError(400, f"'{where}phase' must be one of {names}", param="phase")
    report = PhaseReport(
        rollout_id,
        phase,
        {n: opt_str(body, n) for n in FIELDS},
        str_map(body, "metadata"),
        costs(body.get("costs")),
    )
    if body.get("reward") is not None:
        given = body["reward"]
        if phase is not RolloutPhase.VERIFIED or not isinstance(given, dict):
            raise ProxyError(
                400,
                f"'{where}reward' rides only on a verified phase, as an object: "
                '{"reward": 1.0, "components": {...}, "verifier": ...}',
                param="reward",
            )
        known = state.rollouts.get(rollout_id) or state.rollouts.finished(rollout_id)
        report.reward = reward_event(given, rollout_id, known, param=f"{where}reward.")
    return report


Record = tuple[RolloutEvent | RewardEvent, Known]  # a record with the proxy's rollout of its id


def records(state: ProxyState, report: PhaseReport) -> list[Record]:
    """What ``report`` records, in order: its RolloutEvent, then its reward if it carries one;
    each with the proxy's rollout of its id (its task, group and harness, where not given)."""
    live = state.rollouts.get(report.rollout_id)
    done = state.rollouts.finished(report.rollout_id)
    given = report.fields
    event = rollout_event(
        report.rollout_id,
        report.phase,
        now_us(),
        task_id=given["task_id"] or (live.task_id if live else done.task_id if done else None),
        group_id=given["group_id"] or (live.group_id if live else None),
        harness=given["harness"] or (live.harness if live else None),
        backend=given["backend"],
        message=given["message"],
        metadata=report.metadata,
        costs=report.costs,
    )
    out: list[Record] = [(event, live or done)]
    if report.reward is not None:
        out.append((report.reward, live or done))
    return out


def _answer(report: PhaseReport) -> dict[str, Any]:
    answer: dict[str, Any] = {"rollout_id": report.rollout_id, "phase": report.phase.value}
    if report.reward is not None:
        answer["reward_event_id"] = report.reward.event_id
    return answer


def costs(value: object) -> dict[str, float]:
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
