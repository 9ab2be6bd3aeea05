"""Where each task's rollouts run on one machine: in a container of the task's own image, or in
bubblewrap over this machine's own system directories.

``SandboxMode.AUTO`` (the default): a task with an ``environment/Dockerfile`` or a prebuilt
``[environment] docker_image`` runs in the runc container sandbox, from its image, built (and
cached) by :mod:`infra.images` when the task is checked, before any of its rollouts starts; a
task without one runs in bubblewrap. ``CONTAINER`` is the same, and refuses to fall back where the
container sandbox cannot work here; ``BUBBLEWRAP`` runs every task in bubblewrap (the fast path,
with the Dockerfile's subset: :mod:`orchestrator.workspace`). One code path for the rollout
backend and for ``openforge replay rescore``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from infra.images import ImageBuilder, ImagePolicy, TaskImage
from infra.sandbox import RuncSandbox, SandboxBackend
from infra.tasks import Task
from orchestrator.workspace import Prepared, lay_out, lay_out_image, notes
from schemas.errors import ConfigError, SetupError, TaskError


class SandboxMode(StrEnum):
    """``--sandbox``: how tasks with an image of their own are run."""

    AUTO = "auto"  # their image in a container; bubblewrap for tasks without one
    CONTAINER = "container"  # the same, for every task with an image; no fallback
    BUBBLEWRAP = "bubblewrap"  # every task on the host's root filesystem (Dockerfile subset)


def machine_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


class Environments:
    """The images of the tasks checked so far, and the sandbox each task's runs use."""

    def __init__(
        self,
        host: SandboxBackend,
        mode: SandboxMode = SandboxMode.AUTO,
        policy: ImagePolicy | None = None,
        container: SandboxBackend | None = None,
        builder: ImageBuilder | None = None,
    ) -> None:
        self.host = host
        self.mode = mode
        self.policy = policy or ImagePolicy()
        self._container = container
        self._builder = builder
        self._images: dict[str, TaskImage] = {}
        self._unavailable: str | None = None
        self._lock = threading.Lock()

    def uses_image(self, task: Task) -> bool:
        has_image = task.dockerfile is not None or bool(task.environment.docker_image)
        if not has_image or self.mode is SandboxMode.BUBBLEWRAP:
            return False
        return self.mode is SandboxMode.CONTAINER or self.container_unavailable() is None

    def container_unavailable(self) -> str | None:
        """Why the container sandbox cannot run here (None: it can); checked once."""
        if self._unavailable is None:
            try:
                self.container.preflight()
                self._unavailable = ""
            except SetupError as exc:
                self._unavailable = str(exc)
        return self._unavailable or None

    @property
    def container(self) -> SandboxBackend:
        if self._container is None:
            self._container = RuncSandbox()
        return self._container

    @property
    def builder(self) -> ImageBuilder:
        if self._builder is None:
            self._builder = ImageBuilder(policy=self.policy)
        return self._builder

    def check(self, task: Task, say: Callable[[str], None] = lambda _: None) -> list[str]:
        """What the run's log says of how ``task`` runs; its image is built (or found cached)
        now. TaskError for a task that cannot run here (its image, its user, its memory)."""
        if not self.uses_image(task):
            if task.environment.docker_image:
                raise ConfigError(
                    f"task {task.id} ({task.config_file}) runs in the image "
                    f"{task.environment.docker_image!r}, which --sandbox bubblewrap cannot "
                    "provide: run it with --sandbox auto (a container of that image)"
                )
            said = notes(task)
            if said and self.mode is SandboxMode.AUTO:
                said.insert(0, f"{task.id}: not in a container: {self.container_unavailable()}")
            return said
        machine = machine_memory_mb()
        if task.environment.memory_mb > machine:
            raise TaskError(
                f"task {task.id} asks for {task.environment.memory_mb} MB of memory and this "
                f"machine has {machine} MB: lower [environment] memory_mb, or run it elsewhere"
            )
        self.container.preflight()
        image = self.builder.image(task, say)
        with self._lock:
            self._images[task.id] = image
        return [f"{task.id}: {image.describe()}"]

    def prepare(self, task: Task, root: Path) -> Prepared:
        """Lay out one attempt of ``task`` under ``root`` (its image's, or the host's)."""
        if not self.uses_image(task):
            return lay_out(task, root)
        with self._lock:
            image = self._images.get(task.id)
        if image is None:  # not checked in this process (a re-score): find or build it now
            self.check(task)
            image = self._images[task.id]
        return lay_out_image(task, root, image)

    def sandbox(self, prepared: Prepared) -> SandboxBackend:
        return self.container if prepared.root is not None else self.host

    def preflight(self) -> None:
        """The host sandbox's tools; the container sandbox's when no task may fall back."""
        self.host.preflight()
        if self.mode is SandboxMode.CONTAINER:
            try:
                self.container.preflight()
            except SetupError as exc:
                raise SetupError(f"--sandbox container: {exc}") from exc

    def cancel(self) -> None:
        self.host.cancel()
        if self._container is not None:
            self._container.cancel()
