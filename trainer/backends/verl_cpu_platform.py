"""A CPU platform for veRL, registered through its platform plugin registry.

veRL 0.9.1 ships CUDA, ROCm and NPU platforms and falls back to CUDA when none is present, so its
FSDP engine cannot start on a machine without an accelerator. This platform (device ``cpu``,
communication backend ``gloo``) lets the same engine, the same FSDP wrapping and the same losses
run on CPU, one process or several, which is how the veRL backend is tested without a GPU.
Selected with ``VERL_PLATFORM=cpu`` or :func:`use_cpu_platform`.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _device_module() -> ModuleType:
    """``torch.cpu`` plus the memory queries veRL asks a device module (answered from RSS)."""
    module = ModuleType("openforge_verl_cpu")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))
    for name in ("memory_allocated", "memory_reserved"):
        setattr(module, name, lambda *a, **k: _rss_bytes())
    for name in ("max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, lambda *a, **k: _peak_rss_bytes())
    module.mem_get_info = lambda *a, **k: (0, 0)  # type: ignore[attr-defined]
    module.reset_peak_memory_stats = lambda *a, **k: None  # type: ignore[attr-defined]
    module.empty_cache = lambda *a, **k: None  # type: ignore[attr-defined]
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.get_device_name = lambda *a, **k: "CPU"  # type: ignore[attr-defined]
    module.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[attr-defined]
    module.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[attr-defined]
    return module


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """veRL on CPU: no device to select, no cache to empty, gloo for collectives."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return not torch.cuda.is_available()

    def current_device(self) -> Any:
        # veRL moves tensors with ``.to(get_device_id())``: the device itself, not an index.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "OPENFORGE_VISIBLE_CPUS"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def use_cpu_platform() -> None:
    """Make veRL run on CPU from now on (call before building a veRL engine): select this
    platform and register veRL's own FSDP language-model engine for the ``cpu`` device."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    set_platform(PlatformCPU())
    registry = EngineRegistry._engines.get("language_model", {})
    if "cpu" not in registry.get("fsdp", {}):
        EngineRegistry.register(
            model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu"
        )(FSDPEngineWithLMHead)
