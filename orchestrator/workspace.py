"""How the local backend gives a task the world its Dockerfile asks for, without building an image.

Without a Dockerfile, ``environment/`` is copied into the workspace, which appears at the task's
``workdir``. With one, its safe subset (:mod:`infra.tasks.dockerfile`) is applied: ``WORKDIR`` is
where the workspace appears; ``COPY``/``ADD`` lay files from ``environment/`` into the workspace,
or, for a destination outside it, into a per-rollout directory mounted at that path; ``ENV`` is
set for the harness, the oracle and the verifier; ``pip install`` packages come from a cached
environment whose ``bin`` is first on ``PATH``. The base image is this machine's root
filesystem, read-only: :func:`notes` says so for the run's log.
"""

from __future__ import annotations

import functools
import glob
import os
import posixpath
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from infra.images import ImageUser, TaskImage
from infra.sandbox import Mount, RootFs
from infra.tasks import Task
from infra.tasks.dockerfile import REFUSAL_ADVICE, ImagePlan, parse
from infra.tasks.pip_env import ensure_pip_env
from schemas.errors import TaskError

# Directories the sandbox takes from the host read-only: nothing can be copied under them.
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/proc", "/dev", "/tmp", "/logs")
RESERVED = ("/tests", "/solution", "/run")


@dataclass
class Prepared:
    """A laid-out attempt: where the workspace appears, and what the sandboxes add for it."""

    workdir: str
    dirs: dict[str, Path]
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    path_prefix: list[str] = field(default_factory=list)
    root: RootFs | None = None  # the task's image (the container sandbox), or None: the host's
    # The image's ENTRYPOINT, run before each command in it (``exec "$@"`` at its end): how a
    # web task's image starts its app, for the agent and again for the verifier, as Docker runs
    # it (and Harbor, whose exec'd commands find it started).
    entrypoint: tuple[str, ...] = ()


def image_plan(task: Task) -> ImagePlan | None:
    """The task's Dockerfile subset (None without a Dockerfile); TaskError names a refused
    line, or a destination the local backend cannot provide."""
    if task.dockerfile is None:
        return None
    plan = _parse(task.dockerfile, task.dockerfile.stat().st_mtime_ns)
    workdir = plan.workdir or task.environment.workdir
    for copy in plan.copies:
        dest = copy.dest.rstrip("/") or "/"
        inside = dest == workdir or dest.startswith(workdir.rstrip("/") + "/")
        if not inside and (
            dest == "/" or any(dest == s or dest.startswith(s + "/") for s in SYSTEM + RESERVED)
        ):
            raise TaskError(
                f"{task.dockerfile}:{copy.line}: COPY into {copy.dest}, which the local sandbox "
                f"takes from this machine read-only (or reserves): {REFUSAL_ADVICE}"
            )
    return plan


@functools.lru_cache(maxsize=256)
def _parse(dockerfile: Path, mtime_ns: int) -> ImagePlan:
    """Parsed once per file version: every rollout of a task lays out the same image."""
    return parse(dockerfile)


def notes(task: Task) -> list[str]:
    """What the run's log should say about how this task's image is provided."""
    plan = image_plan(task)
    if plan is None:
        return []
    out = [
        f"{task.id}: FROM {plan.base or '(none)'}: the local backend runs on this machine's root "
        "filesystem (read-only) instead of that image"
    ]
    if plan.requirements:
        out.append(
            f"{task.id}: pip packages from a cached environment: {' '.join(plan.requirements)}"
        )
    out += [f"{task.id}: not applied (changes nothing a rollout sees): {n}" for n in plan.noted]
    return out


def _copy(src: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, target)


def _dirs(root: Path) -> dict[str, Path]:
    dirs = {
        "workspace": root / "workspace",
        "home": root / "home",
        "agent_logs": root / "logs" / "agent",
        "verifier_logs": root / "logs" / "verifier",
        "artifacts": root / "artifacts",  # the agent's /logs/artifacts, and what is collected
    }
    if root.exists():  # a rerun of the same attempt starts clean
        shutil.rmtree(root)
    for path in dirs.values():
        path.mkdir(parents=True)
    return dirs


def lay_out_image(
    task: Task, root: Path, image: TaskImage, user: ImageUser | None = None
) -> Prepared:
    """An attempt in the task's own image: the workspace starts as the image's ``WORKDIR`` (what
    its ``COPY`` and ``RUN`` lines left there, owners kept), appears at that path, and belongs,
    with the home and the log directories, to the image's user (or ``user``: the task's
    ``[agent] user``); the image's ``ENV`` is set."""
    dirs = _dirs(root)
    workdir = image.config.workdir or task.environment.workdir
    source = image.rootfs / workdir.lstrip("/")
    if workdir != "/" and source.is_dir():
        dirs["workspace"].rmdir()
        done = subprocess.run(
            ["cp", "-a", "--", str(source), str(dirs["workspace"])], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise OSError(f"cannot copy the image's {workdir} into the workspace: {done.stderr}")
    user = user or image.user
    if not user.root:
        for name in ("home", "agent_logs", "verifier_logs", "artifacts"):
            os.chown(dirs[name], user.uid, user.gid)
        if not source.is_dir():
            os.chown(dirs["workspace"], user.uid, user.gid)
    env = {**image.config.env, **task.environment.env}
    root_fs = RootFs(image.rootfs, user.uid, user.gid)
    return Prepared(workdir, dirs, env, root=root_fs, entrypoint=image.config.entrypoint)


def lay_out(task: Task, root: Path) -> Prepared:
    """Create an attempt's directories under ``root`` and give it the task's files (on the
    host's root filesystem: the Dockerfile's subset, :func:`image_plan`)."""
    dirs = _dirs(root)
    context = task.environment_dir
    plan = image_plan(task)
    if plan is None:
        if context is not None:
            for item in context.iterdir():
                _copy(item, dirs["workspace"] / item.name)
        return Prepared(task.environment.workdir, dirs, dict(task.environment.env))
    assert context is not None  # the Dockerfile lives in environment/
    workdir = plan.workdir or task.environment.workdir
    outside: dict[str, Path] = {}  # top-level inside dir -> its host directory
    for copy in plan.copies:
        matches = [Path(m) for s in copy.sources for m in sorted(glob.glob(str(context / s)))]
        if not matches:
            raise TaskError(
                f"{task.dockerfile}:{copy.line}: nothing in environment/ matches {copy.sources}"
            )
        as_dir = copy.dest.endswith("/") or len(matches) > 1 or any(m.is_dir() for m in matches)
        dest = posixpath.normpath(copy.dest)
        if dest == workdir or dest.startswith(workdir.rstrip("/") + "/"):
            host = dirs["workspace"] / posixpath.relpath(dest, workdir)
        else:
            top = "/" + dest.strip("/").split("/")[0]
            base = outside.setdefault(top, root / "image" / top.strip("/"))
            host = base / posixpath.relpath(dest, top)
        for m in matches:
            if m.name == "Dockerfile" and m.parent == context:
                continue  # the recipe is not part of the image
            if m.is_dir() and as_dir:
                _copy(m, host)  # a directory's contents
            else:
                _copy(m, host / m.name if as_dir else host)
    prepared = Prepared(workdir, dirs, {**plan.env, **task.environment.env})
    for top, host in outside.items():
        host.mkdir(parents=True, exist_ok=True)
        prepared.mounts.append(Mount(host, top, read_only=False))
    if plan.requirements:
        env = ensure_pip_env(plan.requirements)
        prepared.mounts.append(Mount(env.root, str(env.root), read_only=True))
        prepared.path_prefix.append(str(env.bin_dir))
    return prepared
