"""The rollout backends by name (``--backend``): each a factory of
``(sandbox, proxy endpoint, **options) -> RolloutBackend``."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.backend import RolloutBackend, RolloutBackendName
from orchestrator.kubernetes import KubernetesBackend
from orchestrator.local import LocalBackend
from schemas.registry import Registry

ROLLOUT_BACKENDS: Registry[Callable[..., RolloutBackend]] = Registry("rollout backend")
ROLLOUT_BACKENDS.add(RolloutBackendName.LOCAL, LocalBackend)
ROLLOUT_BACKENDS.add(RolloutBackendName.KUBERNETES, KubernetesBackend.create)
