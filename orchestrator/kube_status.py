"""Reading a rollout pod's status as the API server reports it (JSON): the termination
messages of its ``agent`` and ``verifier`` containers, and why a pod cannot start."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

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
