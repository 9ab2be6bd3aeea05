"""The Kubernetes objects of a rollout: its pod, its Secret, its task's ConfigMaps, the run's
anchor, and the rollout namespace's NetworkPolicy (plain dicts, as the API takes them).

One pod per rollout; its containers run in order:

1. init ``workspace`` (the task's image): copies the image's WORKDIR and the task's files
   (``environment/``, or its Dockerfile's ``COPY`` lines) into the ``workspace`` volume;
2. init ``tools`` (the harness image; only when the task brings its own image and it was not
   built here with the harness's install added, :mod:`infra.images.layers`): copies the
   harness's install (:meth:`Harness.read_only_paths`) into a volume mounted read-only, at the
   same paths, into the agent's container;
3. init ``agent``: the harness, headless, under the task's agent timeout. Its environment (the
   proxy's per-rollout URL and key) and its home directory come from the rollout's Secret,
   mounted into this container only. It writes ``{"exit_code": N}`` to its termination log,
   with the CPU time and peak memory its container's cgroup counted (the rollout's costs);
4. ``verifier``: first the workspace as the agent left it to its log
   (:mod:`orchestrator.kube_workspace`), then ``bash /tests/test.sh`` over the workspace, with
   ``tests/`` (a ConfigMap) mounted into this container only; it writes its exit code and the
   reward file (``reward.json`` / ``reward.txt``) to its termination log, which the backend
   reads.

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
from orchestrator.kube_workspace import archive_script
from schemas.errors import ConfigError

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
            :meth:`Harness.read_only_paths` names (the OpenForge image); without an image
            sink, the agent runs in it when the task brings no image, else its install is
            copied into the task's image (with a sink, no pod needs it: kube_images).
        run_as_user: the uid (and gid) every container runs as.
        read_only_root: a read-only root filesystem for every container.
        annotations: extra annotations on every pod.
        egress_canary: ``HOST:PORT`` that no NetworkPolicy allows (the local cluster's node
            prints it): the pod's first container waits until its connection there is refused,
            so that no container of the rollout runs before the policy agent has confined the
            pod (up to 30 s, then the pod fails: an infrastructure failure). None: no wait.
        image_pull_policy: every container's (``IfNotPresent``: images published to a node's
            containerd by an image sink are found there; built images are named by content).
        stray_ttl_s: after this, a run's objects count as strays that a later run deletes.
        cpu_request: the share of the task's ``cpus`` a pod requests; its limit stays the
            task's ``cpus``. 1.0 reserves them (requests = limits: a node admits only as many
            rollouts as it has cores); below 1, rollouts share cores (e.g. 0.25: four
            one-core rollouts per core), which suits agents that mostly wait on the model.
    """

    namespace: str = "openforge-rollouts"
    proxy_url: str = "http://openforge-proxy.openforge.svc:8000"
    harness_image: str = "ghcr.io/openforge/openforge:latest"
    run_as_user: int = 1000
    read_only_root: bool = True
    annotations: dict[str, str] = field(default_factory=dict)
    image_pull_policy: str = "IfNotPresent"
    egress_canary: str | None = None
    stray_ttl_s: float = 24 * 3600.0
    cpu_request: float = 1.0

    def __post_init__(self) -> None:
        check_cpu_request(self.cpu_request)


def check_cpu_request(share: float) -> None:
    """ConfigError unless ``share`` is a share of a task's cpus a pod can request."""
    if not 0.01 <= share <= 1.0:
        raise ConfigError(
            f"kubernetes.cpu_request = {share} (--kube-cpu-request): the share of a task's cpus "
            "a pod requests is between 0.01 and 1 (1: requests = limits)"
        )


def _resources(task: Task, cpu_request: float = 1.0) -> dict[str, Any]:
    env = task.environment
    amounts = {"cpu": str(env.cpus), "memory": f"{env.memory_mb}Mi",
               "ephemeral-storage": f"{env.storage_mb}Mi"}  # fmt: skip
    if env.gpus:
        amounts["nvidia.com/gpu"] = str(env.gpus)
    requests = dict(amounts)
    if cpu_request < 1.0:
        requests["cpu"] = f"{max(10, round(env.cpus * 1000 * cpu_request))}m"
    return {"requests": requests, "limits": dict(amounts)}


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


@dataclass(frozen=True)
class _Pod:
    """What the containers of one rollout's pod share."""

    task: Task
    objects: TaskObjects
    image: str  # the task's image, else the harness image
    security: dict[str, Any]
    resources: dict[str, Any]
    pull_policy: str
    canary: str | None = None

    def container(self, name: str, script: str, mounts: list[dict[str, Any]],
                  image: str | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
        return {
            "name": name, "image": image or self.image, "command": _sh(script), **extra,
            "imagePullPolicy": self.pull_policy,
            "volumeMounts": [_mount("tmp", "/tmp"), *mounts],
            "securityContext": self.security, "resources": self.resources,
        }  # fmt: skip


# Defines ``usage``: what the container's own cgroup counted so far, as JSON members (``,
# "cpu_us": N, "peak_bytes": M``; each left out where unreadable), cgroup v2 or v1. Plain sh and
# `read` (no awk): task images are anyone's.
_USAGE = (
    "usage() { c=; m=; "
    "if [ -r /sys/fs/cgroup/cpu.stat ]; then read -r _ c < /sys/fs/cgroup/cpu.stat; "
    "elif [ -r /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then "
    "read -r c < /sys/fs/cgroup/cpuacct/cpuacct.usage; c=$((c / 1000)); fi; "
    "for f in /sys/fs/cgroup/memory.peak /sys/fs/cgroup/memory/memory.max_usage_in_bytes; do "
    '[ -r "$f" ] && { read -r m < "$f"; break; }; done; '
    'case "$c" in *[!0-9]*|"") ;; *) printf \', "cpu_us": %s\' "$c";; esac; '
    'case "$m" in *[!0-9]*|"") ;; *) printf \', "peak_bytes": %s\' "$m";; esac; }; '
)


def _confined(canary: str) -> str:
    """Waits (bash's /dev/tcp; the verifier needs bash anyway) until a connection to the
    canary is refused: the pod's NetworkPolicy is in force. Exit 1 after 30 s."""
    host, port = canary.rsplit(":", 1)
    probe = f"(exec 3<>/dev/tcp/{host}/{int(port)}) 2>/dev/null"
    return shlex.join(["bash", "-c", (
        f"for i in $(seq 150); do {probe} || exit 0; sleep 0.2; done; "
        "echo 'egress not confined after 30 s: is the NetworkPolicy agent running?' >&2; exit 1"
    )])  # fmt: skip


def _workspace_init(pod: _Pod) -> dict[str, Any]:
    """Copies the image's WORKDIR and the task's files into the workspace volume (first, with
    an egress canary: waits until the pod is confined)."""
    steps = [_confined(pod.canary)] if pod.canary else []
    workdir = shlex.quote(pod.objects.workdir)
    steps.append(f"{{ cp -a {workdir}/. {WORKSPACE_MOUNT}/ 2>/dev/null || true; }}")
    mounts = [_mount("workspace", WORKSPACE_MOUNT)]
    if pod.objects.environment is not None:
        steps.append(f"tar -xzf {BUNDLE_MOUNT}/environment/environment.tar.gz -C {WORKSPACE_MOUNT}")
        mounts.append(_mount("environment", f"{BUNDLE_MOUNT}/environment", True))
    return pod.container("workspace", " && ".join(steps), mounts)


def _tools_init(
    pod: _Pod, harness_image: str, paths: list[Path]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Copies the harness's install out of the harness image; and the agent's read-only mounts
    of it, at the same paths."""
    copies, mounts = [], []
    for n, path in enumerate(paths):
        q = shlex.quote(str(path))
        copies.append(f"mkdir -p {TOOLS_MOUNT}/{n} && cp -a {q} {TOOLS_MOUNT}/{n}/item")
        mounts.append(_mount("tools", str(path), True, sub=f"{n}/item"))
    init = pod.container(
        "tools", " && ".join(copies), [_mount("tools", TOOLS_MOUNT)], image=harness_image
    )
    return init, mounts


def _agent_init(
    pod: _Pod, invocation: Invocation, home: Path, secret_name: str,
    tool_mounts: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """The harness under the task's agent timeout, its exit code to the termination log."""
    objects, workdir = pod.objects, pod.objects.workdir
    solution = ""
    if objects.solution is not None:  # solution/ at /solution, for this container only
        solution = "tar -xzf /openforge/solution-files/solution.tar.gz -C /solution && "
    script = (
        # The home's contents into its (volume) directory, which a non-root user may not chmod
        f"tar -xzf {SECRET_MOUNT}/home.tar.gz -C {shlex.quote(str(home))} && "
        f"{solution}cd {shlex.quote(workdir)} && "
        f"timeout -k 5 {int(pod.task.agent.timeout_sec)} "
        f"{shlex.join([*objects.entrypoint, *invocation.argv])}; "
        f"code=$?; {_USAGE}"
        'printf \'{"exit_code": %d%s}\' "$code" "$(usage)" > /dev/termination-log; exit 0'
    )
    secret_env = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": f"env.{k}"}}}
        for k in sorted(invocation.env)
    ]
    env = [*({"name": k, "value": v} for k, v in sorted(objects.env.items())), *secret_env]
    mounts = [
        _mount("workspace", workdir), _mount("home", str(home)),
        _mount("agent-logs", "/logs/agent"), _mount("rollout", SECRET_MOUNT, True),
        *tool_mounts,
        *([_mount("solution", "/solution"),
           _mount("solution-files", "/openforge/solution-files", True)]
          if objects.solution is not None else []),
    ]  # fmt: skip
    return pod.container("agent", script, mounts, env=env)


def _verifier(pod: _Pod) -> dict[str, Any]:
    """``tests/test.sh`` over the workspace; its exit code and reward file to the termination
    log."""
    workdir = pod.objects.workdir
    # The tests arrive as a tarball (a ConfigMap keeps no directories), unpacked at /tests.
    script = (
        "tar -xzf /openforge/tests/tests.tar.gz -C /tests && "
        f"{{ {archive_script(workdir)}}} && "
        f"cd {shlex.quote(workdir)} && timeout -k 5 {int(pod.task.verifier.timeout_sec)} "
        f"{shlex.join([*pod.objects.entrypoint, 'bash', '/tests/test.sh'])}; code=$?; {_USAGE}"
        "f=; if [ -f /logs/verifier/reward.json ]; then f=reward.json; "
        "elif [ -f /logs/verifier/reward.txt ]; then f=reward.txt; fi; "
        '{ printf \'{"exit_code": %d, "file": "%s"%s}\\n\' "$code" "$f" "$(usage)"; '
        f'[ -n "$f" ] && head -c {TERMINATION_LIMIT} "/logs/verifier/$f"; }} '
        "> /dev/termination-log; exit 0"
    )
    env = [{"name": k, "value": v}
           for k, v in sorted({**pod.objects.env, **pod.task.verifier.env}.items())]  # fmt: skip
    mounts = [
        _mount("workspace", workdir), _mount("tests", "/openforge/tests", True),
        _mount("tests-files", "/tests"), _mount("verifier-logs", "/logs/verifier"),
        _mount("agent-logs", "/logs/agent", True),
    ]  # fmt: skip
    return pod.container("verifier", script, mounts, env=env)


def _volumes(objects: TaskObjects, secret_name: str, tools: bool) -> list[dict[str, Any]]:
    def config_map(name: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "configMap": {"name": obj["metadata"]["name"]}}

    volumes: list[dict[str, Any]] = [
        {"name": n, "emptyDir": {}}
        for n in ("tmp", "workspace", "home", "agent-logs", "verifier-logs", "tests-files")
    ]
    volumes.append({"name": "rollout", "secret": {"secretName": secret_name, "defaultMode": 0o440,
                    "items": [{"key": "home.tar.gz", "path": "home.tar.gz"}]}})  # fmt: skip
    volumes.append(config_map("tests", objects.tests))
    if objects.environment is not None:
        volumes.append(config_map("environment", objects.environment))
    if tools:
        volumes.append({"name": "tools", "emptyDir": {}})
    if objects.solution is not None:
        volumes.append({"name": "solution", "emptyDir": {}})
        volumes.append(config_map("solution-files", objects.solution))
    return volumes


def _init_containers(
    pod: _Pod, harness: Harness, settings: PodSettings, invocation: Invocation, home: Path,
    secret_name: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """``workspace``, ``tools`` where needed, ``agent``."""
    # In the task's own image, the harness's install is copied in from the harness image,
    # unless the image was built with it (an image sink's build adds it as a layer).
    own = pod.image != settings.harness_image and not pod.objects.holds_harness
    paths = harness.read_only_paths() if own else []
    init = [_workspace_init(pod)]
    tool_mounts: list[dict[str, Any]] = []
    if paths:
        tools_init, tool_mounts = _tools_init(pod, settings.harness_image, paths)
        init.append(tools_init)
    init.append(_agent_init(pod, invocation, home, secret_name, tool_mounts))
    return init


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
    image = objects.image or settings.harness_image
    pod = _Pod(
        task, objects, image, _security(settings), _resources(task, settings.cpu_request),
        settings.image_pull_policy, settings.egress_canary,
    )  # fmt: skip
    init = _init_containers(pod, harness, settings, invocation, home, secret_name)
    tools = any(c["name"] == "tools" for c in init)
    deadline = int(task.agent.timeout_sec) + int(task.verifier.timeout_sec) + STARTUP_S
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
            "containers": [_verifier(pod)],
            "volumes": _volumes(objects, secret_name, tools),
        },
    }  # fmt: skip


def rollout_secret(
    name: str, namespace: str, env: dict[str, str], home: Path, labels: dict[str, str],
    owner: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """The rollout's Secret: the harness's environment (its key) and its home directory."""
    files = [(p, p.relative_to(home).as_posix()) for p in sorted(home.rglob("*"))]
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
