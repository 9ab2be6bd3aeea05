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
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from infra.images import ImageBuilder, ImagePolicy, ImageUser, TaskImage, image_user
from infra.sandbox import RuncSandbox, SandboxBackend
from infra.tasks import Task, harbor
from orchestrator.workspace import Prepared, lay_out, lay_out_image, notes
from schemas.errors import ConfigError, SetupError, TaskError


class SandboxMode(StrEnum):
    """``--sandbox``: how tasks with an image of their own are run."""

    AUTO = "auto"  # their image in a container; bubblewrap for tasks without one
    CONTAINER = "container"  # the same, for every task with an image; no fallback
    BUBBLEWRAP = "bubblewrap"  # every task on the host's root filesystem (Dockerfile subset)


def machine_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


@dataclass(frozen=True)
class Images:
    """A checked task's images: its own, the user its agent runs as (None: the image's), and
    its separate verifiers' (by step; None: the task's own verifier)."""

    task: TaskImage
    user: ImageUser | None
    verifiers: dict[str | None, TaskImage]


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
        self._images: dict[str, Images] = {}
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
        """What the run's log says of how ``task`` runs; its image (and its verifier's) is
        built, or found cached, now. TaskError for a task that cannot run here (what it asks
        for, its image, its user, its memory)."""
        harbor.check(task)
        if not self.uses_image(task):
            return self._check_host(task)
        machine = machine_memory_mb()
        if task.environment.memory_mb > machine:
            raise TaskError(
                f"task {task.id} asks for {task.environment.memory_mb} MB of memory and this "
                f"machine has {machine} MB: lower [environment] memory_mb, or run it elsewhere"
            )
        self.container.preflight()
        image = self.builder.image(task, say)
        user = self._user(image, harbor.agent_user(task), task)
        said = [f"{task.id}: {image.describe()}" + (f" (as {user.name})" if user else "")]
        plans: dict[str | None, harbor.VerifierPlan] = {None: harbor.verifier_plan(task)}
        for step in harbor.steps(task):
            plans[step.name] = harbor.verifier_plan(task, step.verifier_extra, step.tests_dir)
        verifiers: dict[str | None, TaskImage] = {}
        for step_name, plan in plans.items():
            if plan.mode is harbor.VerifierMode.SEPARATE:
                verifiers[step_name] = self._verifier_image(task, plan, image, say)
                where = f" of step {step_name}" if step_name else ""
                said.append(
                    f"{task.id}: verifier{where} separate: {verifiers[step_name].describe()}"
                )
        with self._lock:
            self._images[task.id] = Images(image, user, verifiers)
        return said

    def _check_host(self, task: Task) -> list[str]:
        if task.environment.docker_image:
            raise ConfigError(
                f"task {task.id} ({task.config_file}) runs in the image "
                f"{task.environment.docker_image!r}, which --sandbox bubblewrap cannot "
                "provide: run it with --sandbox auto (a container of that image)"
            )
        plans = [harbor.verifier_plan(task)]
        plans += [
            harbor.verifier_plan(task, s.verifier_extra, s.tests_dir) for s in harbor.steps(task)
        ]
        if any(p.dockerfile is not None or p.docker_image for p in plans):
            raise TaskError(
                f"task {task.id}: its verifier runs in an image of its own (tests/Dockerfile or "
                "[verifier.environment] docker_image), which needs the container sandbox: run "
                "it with --sandbox auto, as root"
            )
        fell_back = task.dockerfile is not None and self.mode is SandboxMode.AUTO
        try:
            said = notes(task)
        except TaskError as exc:  # the Dockerfile is past the subset bubblewrap runs
            if not fell_back:
                raise
            raise TaskError(
                f"task {task.id}: not in a container: {self.container_unavailable()}; and in "
                f"bubblewrap: {exc}"
            ) from exc
        if said and fell_back:
            said.insert(0, f"{task.id}: not in a container: {self.container_unavailable()}")
        return said

    def _user(self, image: TaskImage, user: str | None, task: Task) -> ImageUser | None:
        return None if user is None else image_user(image.rootfs, user, f"task {task.id} [agent]")

    def _verifier_image(
        self, task: Task, plan: harbor.VerifierPlan, image: TaskImage, say: Callable[[str], None]
    ) -> TaskImage:
        if plan.dockerfile is not None:
            return self.builder.build(f"{task.id} verifier", plan.dockerfile, say)
        if plan.docker_image:
            return self.builder.prebuilt(f"{task.id} verifier", plan.docker_image, task.config_file)
        return image  # a fresh container of the task's own image

    def _checked(self, task: Task) -> Images:
        with self._lock:
            images = self._images.get(task.id)
        if images is None:  # not checked in this process (a re-score): find or build it now
            self.check(task)
            images = self._images[task.id]
        return images

    def prepare(self, task: Task, root: Path) -> Prepared:
        """Lay out one attempt of ``task`` under ``root`` (its image's, or the host's)."""
        if not self.uses_image(task):
            return lay_out(task, root)
        images = self._checked(task)
        return lay_out_image(task, root, images.task, images.user)

    def prepare_verifier(self, task: Task, root: Path, step: str | None = None) -> Prepared | None:
        """The separate verifier environment of ``task`` (or of its ``step``), laid out fresh
        under ``root``; None when the verifier shares the agent's environment."""
        plan = harbor.verifier_plan(task)
        if step is not None:
            (s,) = [x for x in harbor.steps(task) if x.name == step]
            plan = harbor.verifier_plan(task, s.verifier_extra, s.tests_dir)
        if plan.mode is harbor.VerifierMode.SHARED:
            return None
        if not self.uses_image(task):
            return lay_out(task, root)  # a fresh copy of the task's environment on the host
        images = self._checked(task)
        image = images.verifiers.get(step, images.task)
        user = harbor.verifier_user(task)
        who = None if user is None else image_user(image.rootfs, user, f"task {task.id} [verifier]")
        return lay_out_image(task, root, image, who)

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
