"""The images a Kubernetes backend's pods run, when it has an image sink.

Each task with an image of its own (a Dockerfile or ``docker_image``) is built here (its whole
Dockerfile, as on the local backend), the harness's install is added to it as one layer
(:mod:`infra.images.layers`), and the result is published to the sink
(:mod:`infra.images.sinks`: a node's containerd, or a registry); pods then need no copy of the
harness. A task with no image of its own runs in the catalogue's ``python:3.11-slim``
(:mod:`infra.images.bases`: a shell and Python for its tests, as the local backend's sandbox
offers) with the harness's install added the same way, so no pod needs a separate harness image.
Each (task, harness) is published once per backend, and each harness's install is listed once.
"""

from __future__ import annotations

import logging
import threading

from infra.harnesses import Harness
from infra.images import ImageBuilder, ImagePolicy, bases
from infra.images.layers import Install, install_of, with_install
from infra.images.sinks import image_sink
from infra.tasks import Task
from orchestrator.kube_objects import BuiltImage
from schemas.errors import SetupError

log = logging.getLogger(__name__)
NO_IMAGE_BASE = "python:3.11-slim"  # what a task with no image of its own runs in


class TaskImages:
    """Builds and publishes task images to the sink at ``sink_url``."""

    def __init__(self, sink_url: str, policy: ImagePolicy) -> None:
        self.sink = image_sink(sink_url)
        self.policy = policy
        self._lock = threading.Lock()
        self._builder: ImageBuilder | None = None
        self._installs: dict[str, Install] = {}  # harness name -> its install
        self._built: dict[tuple[str, str], BuiltImage] = {}  # (task, harness) -> its image

    def built(self, task: Task, harness: Harness) -> BuiltImage | None:
        """What :meth:`publish` made for the pair (None: nothing yet)."""
        return self._built.get((task.id, harness.name))

    def publish(self, task: Task, harness: Harness) -> BuiltImage:
        """The task's own image (built or found; the catalogue's :data:`NO_IMAGE_BASE` for a task
        with none) with the harness's install added, and published."""
        key = (task.id, harness.name)
        with self._lock:
            if key in self._built:
                return self._built[key]
            if self._builder is None:
                self._builder = ImageBuilder(policy=self.policy)
            if harness.name not in self._installs:
                self._installs[harness.name] = install_of(harness)
            install = self._installs[harness.name]
        base, workdir, entrypoint = self._image_of(task, self._builder)
        ref = with_install(self._builder.store, base, install)
        built = BuiltImage(self.sink.publish(ref), workdir, True, entrypoint)
        with self._lock:
            self._built[key] = built
        return built

    @staticmethod
    def _image_of(task: Task, builder: ImageBuilder) -> tuple[str, str | None, tuple[str, ...]]:
        """The local image the task's pods start from, its working directory and ENTRYPOINT."""
        if task.dockerfile is not None or task.environment.docker_image:
            image = builder.image(task, say=log.info)
            return image.ref, image.config.workdir, image.config.entrypoint
        ref = bases.by_name()[NO_IMAGE_BASE].ref
        if not builder.store.exists(ref):
            raise SetupError(
                f"task {task.id} has no image of its own, and its pods run in {NO_IMAGE_BASE}, "
                "which this machine's image store lacks: run `scripts/setup images`"
            )
        return ref, task.environment.workdir, ()
