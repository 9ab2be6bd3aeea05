"""Reading a rollout pod's status as the API server reports it (JSON): the termination
messages of its ``agent`` and ``verifier`` containers, and why a pod cannot start."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from infra.harnesses.base import Report
from infra.tasks import VerifierReward
from infra.tasks.reward import parse_reward
from orchestrator.backend import AgentEnd
from schemas.enums import RolloutPhase
from schemas.errors import InfrastructureError

# Waiting reasons that do not clear by themselves (or only after backoffs a batch cannot wait).
STUCK = {
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
}  # fmt: skip
TIMEOUT_EXIT = 124  # coreutils timeout: the command ran past its limit


def statuses(pod: dict[str, Any], init: bool) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses" if init else "containerStatuses") or [])


def terminated(pod: dict[str, Any], container: str, init: bool) -> dict[str, Any] | None:
    for cs in statuses(pod, init):
        if cs.get("name") == container:
            term = (cs.get("state") or {}).get("terminated")
            return dict(term) if term else None
    return None


def stuck(pod: dict[str, Any]) -> str | None:
    """Why the pod cannot start (an image pull, an unschedulable pod), or None."""
    for cs in [*statuses(pod, True), *statuses(pod, False)]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return (f"container {cs.get('name')} cannot start: {waiting['reason']}: "
                    f"{waiting.get('message') or cs.get('image')}")  # fmt: skip
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unschedulable: {cond.get('message') or cond.get('reason')}"
    return None


def message_json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def duration(terminated: dict[str, Any]) -> float:
    try:
        start = datetime.fromisoformat(terminated["startedAt"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(terminated["finishedAt"].replace("Z", "+00:00"))
    except (KeyError, AttributeError, ValueError):
        return 0.0
    return max((end - start).total_seconds(), 0.0)


def verifier_result(terminated: dict[str, Any]) -> tuple[VerifierReward, int, float]:
    """The reward, exit code and duration the verifier's termination message reports (its first
    line ``{"exit_code": N, "file": F}``, then the reward file's text); InfrastructureError when
    there is no reward."""
    head, _, body = (terminated.get("message") or "").partition("\n")
    meta = message_json(head)
    code = meta.get("exit_code")
    file = meta.get("file") or ""
    if not isinstance(code, int):
        raise InfrastructureError(
            f"the verifier's container ended without its report ({terminated.get('reason')}, "
            f"exit code {terminated.get('exitCode')})"
        )
    if not file:
        raise InfrastructureError(
            f"the verifier (exit code {code}) gave no reward: it wrote neither reward.json "
            "nor reward.txt"
        )
    reward = parse_reward(file, body, Path(f"/logs/verifier/{file}"))
    if reward.reward is None:
        raise InfrastructureError(f"the verifier (exit code {code}) gave no reward: {reward.error}")
    return reward, code, duration(terminated)


def usage(terminated: dict[str, Any], container: str) -> dict[str, float]:
    """What the container's own cgroup counted (its wrapper's ``cpu_us`` and ``peak_bytes``) as
    the rollout's costs ``<container>_cpu_s`` and ``<container>_peak_mib``; none it left out."""
    meta = message_json((terminated.get("message") or "").partition("\n")[0])
    costs = {}
    for key, name, scale in (("cpu_us", "cpu_s", 1e-6), ("peak_bytes", "peak_mib", 2.0**-20)):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            costs[f"{container}_{name}"] = value * scale
    return costs


def _agent_code(terminated: dict[str, Any]) -> int | None:
    code = message_json(terminated.get("message") or "").get("exit_code")
    return code if isinstance(code, int) else None


def agent_ran(terminated: dict[str, Any]) -> bool:
    """Whether the harness ended by itself (not killed at its timeout, its wrapper not dead)."""
    return _agent_code(terminated) not in (None, TIMEOUT_EXIT)


def oom_killed(terminated: dict[str, Any], memory_mb: int) -> InfrastructureError | None:
    """Why the verifier will not run after this agent container, or None. Kubernetes counts an
    init container whose cgroup saw an OOM kill as failed, whatever its exit code: the kubelet
    stops the pod's sandbox and never starts the verifier, while the pod stays Pending (until
    its deadline). So the attempt ends here, with no reward: an infrastructure failure the
    orchestrator may retry, saying what to change."""
    if terminated.get("reason") != "OOMKilled":
        return None
    return InfrastructureError(
        f"the agent's container was OOM-killed at its {memory_mb} MiB limit; Kubernetes does "
        "not run the verifier after an OOM-killed init container, so this attempt has no "
        "reward: raise [environment] memory_mb in task.toml if the task needs more"
    )


def agent_end(terminated: dict[str, Any], timeout_s: float, report: Report | None) -> AgentEnd:
    """The agent's end from its container's termination (its wrapper writes
    ``{"exit_code": N}``; 124: the task's agent timeout struck)."""
    code, took = _agent_code(terminated), duration(terminated)
    if code is None:  # the wrapper itself died: a limit struck (OOMKilled, ...)
        code = terminated.get("exitCode")
        reason = terminated.get("reason") or ""
        return AgentEnd(RolloutPhase.FAILED, code, took, f"{reason}: exit code {code}")
    if code == TIMEOUT_EXIT:
        return AgentEnd(RolloutPhase.TIMED_OUT, None, took, f"killed after {timeout_s:.0f}s")
    phase = RolloutPhase.FINISHED if code == 0 else RolloutPhase.FAILED
    return AgentEnd(
        phase, code, took, f"exit code {code}",
        report.final_message if report else None, report.session_id if report else None,
    )  # fmt: skip
