"""The Kubernetes objects of a rollout: its pod, its Secret, its task's ConfigMaps, the run's
anchor, and the rollout namespace's NetworkPolicy (plain dicts, as the API takes them).

One pod per rollout; its containers run in order:

1. init ``workspace`` (the task's image): copies the image's WORKDIR and the task's files
   (``environment/``, or its Dockerfile's ``COPY`` lines) into the ``workspace`` volume;
2. init ``tools`` (the harness image; only when the task brings its own image): copies the
   harness's install (:meth:`Harness.read_only_paths`) into a volume mounted read-only, at the
   same paths, into the agent's container;
3. init ``agent``: the harness, headless, under the task's agent timeout. Its environment (the
   proxy's per-rollout URL and key) and its home directory come from the rollout's Secret,
   mounted into this container only. It writes ``{"exit_code": N}`` to its termination log;
4. ``verifier``: ``bash /tests/test.sh`` over the workspace, with ``tests/`` (a ConfigMap)
   mounted into this container only; it writes its exit code and the reward file
   (``reward.json`` / ``reward.txt``) to its termination log, which the backend reads.

Every container runs as a non-root user, without privilege escalation or capabilities, on a
read-only root filesystem (writable: the workspace, the home, ``/tmp``, ``/logs``); the pod
gets no service-account token and no Service environment variables. The agent cannot read the
tests (not mounted in its container; no token for the API; the NetworkPolicy lets it reach only
the proxy) and holds nothing but its rollout's key.
"""

from __future__ import annotations

import base64
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from infra.harnesses.base import Invocation
from infra.tasks import Task
from orchestrator.kube_objects import (
    EXPIRES,
    ROLE,
    ROLLOUT,
    ROLLOUT_ID,
    TaskObjects,
    dns_name,
    tar_files,
)

TERMINATION_LIMIT = 3000  # bytes of the reward file kept (the termination log holds 4 KiB)
STARTUP_S = 300  # added to the pod's deadline for scheduling, image pulls and the layout
WORKSPACE_MOUNT = "/openforge/workspace"
BUNDLE_MOUNT = "/openforge/bundle"
SECRET_MOUNT = "/openforge/rollout"
TOOLS_MOUNT = "/openforge/tools"


@dataclass(frozen=True)
class PodSettings:
    """How rollout pods are made (the backend's options).

    Attributes:
        namespace: where rollout pods run (its NetworkPolicy confines them).
        proxy_url: the proxy as rollout pods reach it (its Service).
        harness_image: an image holding the harnesses at the paths this orchestrator's
            :meth:`Harness.read_only_paths` names (the OpenForge image); the agent runs in it
            when the task brings no image, else its install is copied into the task's image.
        run_as_user: the uid (and gid) every container runs as.
        read_only_root: a read-only root filesystem for every container.
        annotations: extra annotations on every pod.
        stray_ttl_s: after this, a run's objects count as strays that a later run deletes.
    """

    namespace: str = "openforge-rollouts"
    proxy_url: str = "http://openforge-proxy.openforge.svc:8000"
    harness_image: str = "ghcr.io/openforge/openforge:latest"
    run_as_user: int = 1000
    read_only_root: bool = True
    annotations: dict[str, str] = field(default_factory=dict)
    stray_ttl_s: float = 24 * 3600.0


def _resources(task: Task) -> dict[str, Any]:
    env = task.environment
    amounts = {"cpu": str(env.cpus), "memory": f"{env.memory_mb}Mi",
               "ephemeral-storage": f"{env.storage_mb}Mi"}  # fmt: skip
    if env.gpus:
        amounts["nvidia.com/gpu"] = str(env.gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _security(settings: PodSettings) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_user,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": settings.read_only_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _mount(name: str, path: str, read_only: bool = False, sub: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"name": name, "mountPath": path, "readOnly": read_only}
    if sub is not None:
        m["subPath"] = sub
    return m


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def rollout_pod(
    *,
    name: str,
    rollout_id: str,
    task: Task,
    harness: Harness,
    objects: TaskObjects,
    invocation: Invocation,
    home: Path,
    secret_name: str,
    settings: PodSettings,
    labels: dict[str, str],
    owner: dict[str, Any],
) -> dict[str, Any]:
    """The rollout's pod (see the module docstring)."""
    harness_image = settings.harness_image
    image = objects.image or harness_image
    workdir, sec, res = objects.workdir, _security(settings), _resources(task)
    tools = image != harness_image and bool(harness.read_only_paths())
    common = [_mount("tmp", "/tmp")]
    workspace = [
        f"cp -a {shlex.quote(workdir)}/. {WORKSPACE_MOUNT}/ 2>/dev/null || true",
    ]
    if objects.environment is not None:
        workspace.append(
            f"tar -xzf {BUNDLE_MOUNT}/environment/environment.tar.gz -C {WORKSPACE_MOUNT}"
        )
    init = [{
        "name": "workspace", "image": image, "command": _sh(" && ".join(workspace)),
        "volumeMounts": [*common, _mount("workspace", WORKSPACE_MOUNT),
                         *([_mount("environment", f"{BUNDLE_MOUNT}/environment", True)]
                           if objects.environment is not None else [])],
        "securityContext": sec, "resources": res,
    }]  # fmt: skip
    tool_mounts = []
    if tools:
        copies = []
        for n, path in enumerate(harness.read_only_paths()):
            q = shlex.quote(str(path))
            copies.append(f"mkdir -p {TOOLS_MOUNT}/{n} && cp -a {q} {TOOLS_MOUNT}/{n}/item")
            tool_mounts.append(_mount("tools", str(path), True, sub=f"{n}/item"))
        init.append({
            "name": "tools", "image": harness_image, "command": _sh(" && ".join(copies)),
            "volumeMounts": [*common, _mount("tools", TOOLS_MOUNT)],
            "securityContext": sec, "resources": res,
        })  # fmt: skip
    timeout = int(task.agent.timeout_sec)
    solution = ""
    if objects.solution is not None:  # the oracle: solution/ at /solution, for its container only
        solution = "tar -xzf /openforge/solution-files/solution.tar.gz -C /solution && "
    agent_script = (
        f"tar -xzf {SECRET_MOUNT}/home.tar.gz -C / && {solution}cd {shlex.quote(workdir)} && "
        f"timeout -k 5 {timeout} {shlex.join(invocation.argv)}; "
        'code=$?; printf \'{"exit_code": %d}\' "$code" > /dev/termination-log; exit 0'
    )
    secret_env = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": f"env.{k}"}}}
        for k in sorted(invocation.env)
    ]
    init.append({
        "name": "agent", "image": image, "command": _sh(agent_script),
        "env": [*({"name": k, "value": v} for k, v in sorted(objects.env.items())), *secret_env],
        "volumeMounts": [
            *common, _mount("workspace", workdir), _mount("home", str(home)),
            _mount("agent-logs", "/logs/agent"), _mount("rollout", SECRET_MOUNT, True),
            *tool_mounts,
            *([_mount("solution", "/solution"),
               _mount("solution-files", "/openforge/solution-files", True)]
              if objects.solution is not None else []),
        ],
        "securityContext": sec, "resources": res,
    })  # fmt: skip
    vt = int(task.verifier.timeout_sec)
    # The tests arrive as a tarball (a ConfigMap keeps no directories), unpacked at /tests.
    verifier_script = (
        "tar -xzf /openforge/tests/tests.tar.gz -C /tests && "
        f"cd {shlex.quote(workdir)} && timeout -k 5 {vt} bash /tests/test.sh; code=$?; "
        "f=; if [ -f /logs/verifier/reward.json ]; then f=reward.json; "
        "elif [ -f /logs/verifier/reward.txt ]; then f=reward.txt; fi; "
        '{ printf \'{"exit_code": %d, "file": "%s"}\\n\' "$code" "$f"; '
        f'[ -n "$f" ] && head -c {TERMINATION_LIMIT} "/logs/verifier/$f"; }} '
        "> /dev/termination-log; exit 0"
    )
    containers = [{
        "name": "verifier", "image": image, "command": _sh(verifier_script),
        "env": [{"name": k, "value": v}
                for k, v in sorted({**objects.env, **task.verifier.env}.items())],
        "volumeMounts": [
            *common, _mount("workspace", workdir), _mount("tests", "/openforge/tests", True),
            _mount("tests-files", "/tests"), _mount("verifier-logs", "/logs/verifier"),
            _mount("agent-logs", "/logs/agent", True),
        ],
        "securityContext": sec, "resources": res,
    }]  # fmt: skip
    volumes: list[dict[str, Any]] = [
        {"name": n, "emptyDir": {}}
        for n in ("tmp", "workspace", "home", "agent-logs", "verifier-logs", "tests-files")
    ]
    volumes.append({"name": "rollout", "secret": {"secretName": secret_name, "defaultMode": 0o440,
                    "items": [{"key": "home.tar.gz", "path": "home.tar.gz"}]}})  # fmt: skip
    volumes.append({"name": "tests", "configMap": {"name": objects.tests["metadata"]["name"]}})
    if objects.environment is not None:
        volumes.append(
            {"name": "environment",
             "configMap": {"name": objects.environment["metadata"]["name"]}}
        )  # fmt: skip
    if tools:
        volumes.append({"name": "tools", "emptyDir": {}})
    if objects.solution is not None:
        volumes.append({"name": "solution", "emptyDir": {}})
        volumes.append(
            {"name": "solution-files",
             "configMap": {"name": objects.solution["metadata"]["name"]}}
        )  # fmt: skip
    deadline = timeout + vt + STARTUP_S
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**labels, ROLE: "rollout", ROLLOUT: dns_name("r", rollout_id)},
            "annotations": {
                **settings.annotations,
                ROLLOUT_ID: rollout_id,
                "openforge.dev/task": task.id,
                "openforge.dev/harness": harness.name,
                EXPIRES: str(int(time.time() + settings.stray_ttl_s)),
            },
            "ownerReferences": [owner],
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "activeDeadlineSeconds": deadline,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": True, "runAsUser": settings.run_as_user,
                "runAsGroup": settings.run_as_user, "fsGroup": settings.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": init,
            "containers": containers,
            "volumes": volumes,
        },
    }  # fmt: skip


def rollout_secret(
    name: str, namespace: str, env: dict[str, str], home: Path, labels: dict[str, str],
    owner: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The rollout's Secret: the harness's environment (its key) and its home directory."""
    files = [(p, str(p).lstrip("/")) for p in [home, *sorted(home.rglob("*"))]]
    data = {f"env.{k}": base64.b64encode(v.encode()).decode() for k, v in env.items()}
    data["home.tar.gz"] = base64.b64encode(tar_files(files)).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": {**labels, ROLE: "rollout"},
                     "ownerReferences": [owner]},
        "data": data,
    }  # fmt: skip
