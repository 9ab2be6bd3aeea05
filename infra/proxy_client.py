"""A client of the capture proxy's admin API, for whoever drives rollouts or swaps weights.

    admin = ProxyAdmin("http://127.0.0.1:8100", token)
    reg = admin.register_rollout("ro-1", task_id="t1", group_id="g1", harness="codex")
    ...   # the harness calls reg.openai_base_path with reg.api_key
    admin.finish_rollout("ro-1", RolloutPhase.FINISHED, exit_code=0)
    admin.post_reward("ro-1", 1.0, components={"tests": 1.0}, verifier="pytest@1")

The trainer uses ``pause`` (draining the calls in flight) / ``set_policy_version`` / ``resume``
around a weight swap. Every failure (unreachable proxy, an error answer) is a
:class:`~schemas.errors.ServiceError` naming the route and the proxy's own message. The proxy's
routes are documented in ``proxy/app.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas.enums import RolloutPhase
from schemas.errors import ServiceError


@dataclass(frozen=True, slots=True)
class Finished:
    """The proxy's answer to a rollout's finish: the calls it numbered for the rollout (None:
    it had been finished already) and, when the proxy refused a call whose prompt left no room
    in the model's context, the longest such prompt and that context (tokens); the seconds
    from its registration to its first call's arrival (None: it made none)."""

    calls: int | None
    too_long: tuple[int, int] | None = None
    first_call_s: float | None = None


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered rollout: its id, its minted key (None when none was minted) and the base
    paths a harness is pointed at; behind a worker pool (`openforge proxy --workers N`) also
    the owning worker's URL, which the paths are relative to, and its Unix socket: a harness
    pointed there reaches its worker with no extra hop."""

    rollout_id: str
    api_key: str | None
    openai_base_path: str
    anthropic_base_path: str
    base_url: str | None = None  # with --workers: the URL of the worker that owns the rollout
    worker: int | None = None  # and its index
    unix_socket: str | None = None  # and its Unix socket (the front's --uds given), for sandboxes


@dataclass(frozen=True, slots=True)
class Reward:
    """A rollout's reward as the verifier gave it (the body of ``POST .../reward``)."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    verifier: str | None = None
    verifier_output: str | None = None

    def body(self) -> dict[str, Any]:
        return _given(
            reward=self.reward,
            components=self.components,
            verifier=self.verifier,
            verifier_output=self.verifier_output,
        )


@dataclass(frozen=True, slots=True)
class Phase:
    """An orchestrator phase of a rollout, as :meth:`ProxyAdmin.record_phases` sends it."""

    rollout_id: str
    phase: RolloutPhase
    message: str | None = None
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    backend: str | None = None
    metadata: dict[str, str] | None = None
    costs: dict[str, float] | None = None
    reward: Reward | None = None

    def body(self) -> dict[str, Any]:
        return _given(
            rollout_id=self.rollout_id,
            phase=self.phase.value,
            message=self.message,
            task_id=self.task_id,
            group_id=self.group_id,
            harness=self.harness,
            backend=self.backend,
            metadata=self.metadata,
            costs=self.costs,
            reward=self.reward.body() if self.reward is not None else None,
        )


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that are set (a JSON body without nulls)."""
    return {name: value for name, value in fields.items() if value is not None}


class ProxyUnreachable(ServiceError):
    """No answer from the proxy (refused, reset, timed out): it may be restarting."""


class ProxyAdmin:
    """The admin API of the proxy at ``url`` (bearer ``token`` when the proxy has one)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # One client, shared by threads: kept-alive connections, one TLS context (building a
        # fresh client per call costs tens of milliseconds). Idle ones are dropped after 4 s, before
        # a server with uvicorn's default 5 s could close one under a request.
        self._client = httpx.Client(timeout=timeout, limits=httpx.Limits(keepalive_expiry=4.0))

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            resp = self._client.request(
                method,
                f"{self.url}{path}",
                json=body,
                headers=headers,
                timeout=self.timeout if timeout is None else timeout,
            )
        except httpx.TransportError as exc:
            raise ProxyUnreachable(
                f"cannot reach the proxy at {self.url} ({method} {path}): {exc!r}. "
                "Is it running, and is the URL right?"
            ) from exc
        if resp.status_code >= 400:
            raise ServiceError(
                f"proxy {method} {path} answered {resp.status_code}: {resp.text[:500]}"
            )
        try:
            return dict(resp.json())
        except ValueError as exc:
            raise ServiceError(
                f"proxy {method} {path} answered non-JSON: {resp.text[:200]}"
            ) from exc

    def register_rollout(
        self,
        rollout_id: str | None = None,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        harness: str | None = None,
        harness_version: str | None = None,
        metadata: dict[str, str] | None = None,
        mint_key: bool = True,
        record: bool = True,
    ) -> Registration:
        """Register a rollout (the proxy mints an id when ``rollout_id`` is None); with
        ``record=False`` its calls are served and nothing of it is published."""
        body: dict[str, Any] = {
            "task_id": task_id,
            "group_id": group_id,
            "harness": harness,
            "harness_version": harness_version,
            "mint_key": mint_key,
            "record": record,
        }
        if rollout_id is not None:
            body["rollout_id"] = rollout_id
        if metadata:
            body["metadata"] = metadata
        got = self._call("POST", "/admin/rollouts", body)
        return Registration(
            got["rollout_id"],
            got.get("api_key"),
            got["openai_base_path"],
            got["anthropic_base_path"],
            got.get("base_url"),
            got.get("worker"),
            got.get("unix_socket"),
        )

    def finish_rollout(
        self,
        rollout_id: str,
        phase: RolloutPhase = RolloutPhase.FINISHED,
        *,
        exit_code: int | None = None,
        backend: str | None = None,
        message: str | None = None,
    ) -> Finished:
        """Record the rollout's end (a RolloutEvent with ``phase``); what the proxy saw of it
        (:class:`Finished`)."""
        body: dict[str, Any] = {"phase": phase.value, "exit_code": exit_code}
        if backend is not None:
            body["backend"] = backend
        if message is not None:
            body["message"] = message
        answer = self._call("POST", f"/admin/rollouts/{rollout_id}/finish", body)
        calls, long = answer.get("calls"), answer.get("too_long")
        too_long = None
        if isinstance(long, dict):
            too_long = (int(long.get("prompt_tokens", 0)), int(long.get("context", 0)))
        first = answer.get("first_call_s")
        return Finished(
            calls if isinstance(calls, int) else None,
            too_long,
            float(first) if isinstance(first, int | float) else None,
        )

    def record_phase(
        self,
        rollout_id: str,
        phase: RolloutPhase,
        *,
        message: str | None = None,
        task_id: str | None = None,
        group_id: str | None = None,
        harness: str | None = None,
        backend: str | None = None,
        metadata: dict[str, str] | None = None,
        costs: dict[str, float] | None = None,
        reward: Reward | None = None,
    ) -> str | None:
        """Record an orchestrator phase (queued, verified, infra_failed) of a rollout, with what
        its attempt cost (``costs``: :data:`schemas.rollout.COSTS`); the proxy need not know the
        rollout yet. A verified phase may carry the rollout's ``reward``, recorded with it in
        one write: then the reward's event id is returned (else None)."""
        body = Phase(
            rollout_id, phase, message, task_id, group_id, harness, backend, metadata, costs,
            reward,
        ).body()  # fmt: skip
        answer = self._call("POST", f"/admin/rollouts/{rollout_id}/phase", body)
        event_id = answer.get("reward_event_id")
        return str(event_id) if event_id is not None else None

    def record_phases(self, phases: Sequence[Phase]) -> None:
        """Record many queued or verified phases in one request (a run's queue): all or, if
        the proxy refuses one, none (a worker pool: none of the refusing worker's)."""
        if phases:
            self._call("POST", "/admin/rollouts/phases", {"phases": [p.body() for p in phases]})

    def post_reward(
        self,
        rollout_id: str,
        reward: float,
        *,
        components: dict[str, float] | None = None,
        verifier: str | None = None,
        verifier_output: str | None = None,
    ) -> str:
        """Record the rollout's reward (a RewardEvent, admin token only); returns its event
        id."""
        body = Reward(reward, components or {}, verifier, verifier_output).body()
        return str(self._call("POST", f"/rollout/{rollout_id}/reward", body)["event_id"])

    def policy_version(self) -> int:
        """The policy version the proxy stamps on new tokens."""
        return int(self._call("GET", "/admin/policy")["version"])

    def set_policy_version(self, version: int) -> dict[str, Any]:
        """Stamp ``version`` on the calls that start from now; returns the proxy's policy and
        pause state (``version``, ``paused``, ``in_flight``, ...)."""
        return self._call("POST", "/admin/policy", {"version": version})

    def pause(self, drain: float | None = None) -> dict[str, Any]:
        """Hold (or refuse, per the proxy's pause mode) new calls until :meth:`resume`; returns
        the pause state. With ``drain`` seconds, also wait (at most that long, and no longer
        than the pause lasts) until no call is in flight: then the answer's ``in_flight`` is 0
        and ``paused`` is true."""
        if drain is None:
            return self._call("POST", "/admin/pause")
        return self._call(
            "POST", "/admin/pause", {"drain_s": drain}, timeout=max(self.timeout, drain + 30.0)
        )

    def resume(self) -> dict[str, Any]:
        return self._call("POST", "/admin/resume")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")
