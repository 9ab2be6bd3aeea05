"""The rollout backends by name (``--backend``), each built from its own config section.

    backend = build_backend(RolloutBackendConfig(name="local"), RunProxy(url, socket))

:class:`RolloutBackendConfig` holds one section per backend, named as the backend is; only the
chosen backend's section is read. Adding a backend is its module, its section here and one
registry line: nobody outside branches on the backend's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.backend import RolloutBackend, RolloutBackendName, RunProxy
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.local import LocalBackend, LocalConfig
from schemas.registry import Registry, choose

ROLLOUT_BACKENDS: Registry[type[RolloutBackend]] = Registry("rollout backend")
ROLLOUT_BACKENDS.add(RolloutBackendName.LOCAL, LocalBackend)
ROLLOUT_BACKENDS.add(RolloutBackendName.KUBERNETES, KubernetesBackend)


@dataclass(frozen=True)
class RolloutBackendConfig:
    """Which backend runs the rollouts, and each backend's section (a field named as it is)."""

    name: RolloutBackendName = RolloutBackendName.LOCAL
    local: LocalConfig = field(default_factory=LocalConfig)
    kubernetes: KubeOptions = field(default_factory=KubeOptions)

    def __post_init__(self) -> None:  # a name given as text: checked here, listing the choices
        object.__setattr__(self, "name", choose(RolloutBackendName, self.name, "rollout backend"))

    def section(self) -> object:
        """The chosen backend's section."""
        return getattr(self, self.name.value)


def build_backend(config: RolloutBackendConfig, proxy: RunProxy) -> RolloutBackend:
    """The backend ``config`` names, built from its section for a run whose proxy is
    ``proxy``."""
    return ROLLOUT_BACKENDS.get(config.name).from_config(config.section(), proxy)
