"""The objects of a Kubernetes run besides its pods: the run's anchor (which owns everything
else the run makes, so deleting it deletes the run), a task's files as content-addressed
ConfigMaps, and the rollout namespace's NetworkPolicy (plain dicts, as the API takes them); the
labels and names they share."""

from __future__ import annotations

import base64
import glob
import hashlib
import io
import posixpath
import re
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.tasks import Task
from infra.tasks.dockerfile import ImagePlan
from schemas.errors import ConfigError

ROLE = "openforge.dev/role"
RUN = "openforge.dev/run"
ROLLOUT = "openforge.dev/rollout"  # a DNS-safe digest of the rollout id (label values <= 63)
ROLLOUT_ID = "openforge.dev/rollout-id"  # the rollout id itself (an annotation)
EXPIRES = "openforge.dev/expires-at"  # unix seconds after which a stray may be deleted
MANAGED = {"app.kubernetes.io/managed-by": "openforge"}
CONFIGMAP_LIMIT = 900 * 1024  # an object must stay under 1 MiB; leave room for metadata
_DNS = re.compile(r"[^a-z0-9-]+")


def dns_name(prefix: str, text: str, limit: int = 63) -> str:
    """A DNS-1123 name ``prefix-<slug>-<digest>`` of at most ``limit`` characters."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    slug = _DNS.sub("-", text.lower()).strip("-")
    room = limit - len(prefix) - len(digest) - 2
    slug = slug[:room].strip("-")
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"


@dataclass(frozen=True)
class TaskObjects:
    """A task's files as ConfigMaps, and what its image plan says."""

    image: str | None  # the task's own image (docker_image, or its Dockerfile's FROM)
    workdir: str
    env: dict[str, str]
    environment: dict[str, Any] | None  # ConfigMap with environment.tar.gz, if any files
    tests: dict[str, Any]  # ConfigMap with the files of tests/
    solution: dict[str, Any] | None = None  # ConfigMap with solution/, for the oracle only
    holds_harness: bool = False  # the image carries the harness's install (no copy per pod)
    # The image's ENTRYPOINT: run before the harness and before the verifier, which the pod's
    # own command would otherwise replace (as on the local backend's container sandbox).
    entrypoint: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuiltImage:
    """The image a task's pods run, built here (the task's whole Dockerfile, or the catalogue's
    base for a task with no image) and published where the cluster runs it: the reference pods
    use, its WORKDIR (None: the task's ``workdir``), and whether the harness's install was added
    to it (:mod:`infra.images.layers`)."""

    ref: str
    workdir: str | None
    holds_harness: bool = False
    entrypoint: tuple[str, ...] = ()  # the image's ENTRYPOINT (a web task's app starts there)


def tar_files(files: list[tuple[Path, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for src, arcname in sorted(files, key=lambda f: f[1]):
            info = tar.gettarinfo(str(src), arcname=arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(src, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _tree(root: Path, prefix: str) -> list[tuple[Path, str]]:
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() or path.is_dir():
            out.append((path, posixpath.join(prefix, path.relative_to(root).as_posix())))
    return out


def _workspace_files(task: Task, plan: ImagePlan | None, workdir: str) -> list[tuple[Path, str]]:
    """The task's files as (host path, path relative to the workspace)."""
    env_dir = task.path / "environment"
    if plan is None:
        if not env_dir.is_dir():
            return []
        return [(p, a) for p, a in _tree(env_dir, ".") if p.name != "Dockerfile"]
    files: list[tuple[Path, str]] = []
    for copy in plan.copies:
        dest = copy.dest.rstrip("/") or "/"
        if not (dest == workdir or dest.startswith(workdir.rstrip("/") + "/")):
            raise ConfigError(
                f"{task.dockerfile}:{copy.line}: COPY into {copy.dest}, outside WORKDIR "
                f"{workdir}: the Kubernetes backend lays out the workspace only; build the image "
                "and set [environment] docker_image"
            )
        rel = posixpath.relpath(dest, workdir)
        for pattern in copy.sources:
            for match in sorted(glob.glob(str(env_dir / pattern))):
                src = Path(match)
                if src.is_dir():
                    files += _tree(src, rel)
                elif copy.dest.endswith("/") or len(copy.sources) > 1:
                    files.append((src, posixpath.join(rel, src.name)))
                else:
                    files.append((src, rel))
    return files


def _configmap(name: str, namespace: str, key: str, data: bytes, labels: dict[str, str],
               owner: dict[str, Any], what: str) -> dict[str, Any]:  # fmt: skip
    if len(data) > CONFIGMAP_LIMIT:
        raise ConfigError(
            f"{what} is {len(data) // 1024} KiB compressed, over the {CONFIGMAP_LIMIT // 1024} "
            "KiB a ConfigMap holds: bake the files into the task's image ([environment] "
            "docker_image)"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner]},
        "binaryData": {key: base64.b64encode(data).decode()},
    }  # fmt: skip


def task_objects(
    task: Task,
    plan: ImagePlan | None,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any],
    solution: bool = False,
    built: BuiltImage | None = None,
) -> TaskObjects:
    """The ConfigMaps holding ``task``'s workspace files and tests (and, with ``solution``, its
    solution, for the oracle), named by their run and their content (a run's objects are its own:
    another run's, deleted with it, are never reused). With ``built`` (the task's own image) the
    workspace is the image's WORKDIR as built: no files are laid out (``plan`` is None: no
    Dockerfile line is refused)."""
    scope = labels.get(RUN, "")
    if plan is not None and plan.requirements:
        raise ConfigError(
            f"{task.dockerfile}: RUN pip install {' '.join(plan.requirements)}: the Kubernetes "
            "backend does not build images; build it and set [environment] docker_image"
        )
    workdir = (
        (built.workdir if built else None) or (plan.workdir if plan else None)
        or task.environment.workdir
    )  # fmt: skip
    image = (built.ref if built else None) or task.environment.docker_image
    image = image or (plan.base if plan else None)
    env = dict(plan.env) if plan else {}
    # Baked: the workspace is in the image (the task's own, built, or its docker_image); a task
    # with no image of its own, run in a built base, still has its files laid out.
    baked = (built is not None and task.dockerfile is not None) or bool(
        task.environment.docker_image
    )
    files = [] if baked else _workspace_files(task, plan, workdir)
    environment = None
    if files:
        data = tar_files(files)
        environment = _configmap(
            dns_name("task-env", f"{scope}-{task.id}-{hashlib.sha256(data).hexdigest()}"),
            namespace, "environment.tar.gz", data, labels, owner,
            f"task {task.id}'s environment",
        )  # fmt: skip
    tests = tar_files(_tree(task.tests_dir, "."))
    solved = None
    if solution and task.solution_dir is not None:
        data = tar_files(_tree(task.solution_dir, "."))
        solved = _configmap(
            dns_name("task-solution", f"{scope}-{task.id}-{hashlib.sha256(data).hexdigest()}"),
            namespace, "solution.tar.gz", data, labels, owner, f"task {task.id}'s solution",
        )  # fmt: skip
    return TaskObjects(
        image, workdir, env, environment,
        _configmap(
            dns_name("task-tests", f"{scope}-{task.id}-{hashlib.sha256(tests).hexdigest()}"),
            namespace, "tests.tar.gz", tests, labels, owner, f"task {task.id}'s tests",
        ),
        solved,
        holds_harness=built is not None and built.holds_harness,
        entrypoint=built.entrypoint if built is not None else (),
    )  # fmt: skip


def run_anchor(run: str, namespace: str, ttl_s: float) -> dict[str, Any]:
    """The object every object of a run is owned by: deleting it deletes them all (garbage
    collection), and its expiry marks the run's leftovers as strays."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": dns_name("openforge-run", run),
            "namespace": namespace,
            "labels": {**MANAGED, RUN: dns_name("r", run), ROLE: "run"},
            "annotations": {EXPIRES: str(int(time.time() + ttl_s)), "openforge.dev/run-id": run},
        },
        "data": {"run": run},
    }


def owner_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": "v1", "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"],
            "blockOwnerDeletion": False}  # fmt: skip


def network_policy(
    namespace: str,
    proxy_namespace: str,
    proxy_labels: dict[str, str],
    proxy_port: int,
    proxy_ports: int = 1,
    proxy_cidr: str | None = None,
) -> dict[str, Any]:
    """No ingress; egress only to the proxy's pods on its ``proxy_ports`` consecutive ports from
    ``proxy_port`` (a proxy pool: its front, then its workers), and to the cluster's DNS. With
    ``proxy_cidr`` the proxy is outside the cluster (the local cluster's proxy on this machine,
    at the node's gateway): egress on those ports to that address block instead."""
    port: dict[str, Any] = {"protocol": "TCP", "port": proxy_port}
    if proxy_ports > 1:
        port["endPort"] = proxy_port + proxy_ports - 1
    proxy: dict[str, Any] = (
        {"ipBlock": {"cidr": proxy_cidr}} if proxy_cidr else {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": proxy_namespace}},
            "podSelector": {"matchLabels": proxy_labels},
        }
    )  # fmt: skip
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "openforge-rollouts", "namespace": namespace, "labels": MANAGED},
        "spec": {
            "podSelector": {"matchLabels": {ROLE: "rollout"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {"to": [proxy], "ports": [port]},
                {
                    "to": [{
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
            ],
        },
    }  # fmt: skip
