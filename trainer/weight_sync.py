"""Hand new weights to vLLM without aborting in-flight requests, then bump the policy version.

Two ways, one order. First gate the proxy (new requests wait, or get 429 with Retry-After: the
proxy's setting); then

- ``lora``: hot-load the adapter in place (``/v1/load_lora_adapter`` with ``load_inplace``):
  requests already running finish on the weights they started with;
- ``full``: drain vLLM (``/pause?mode=wait``: running requests finish, none is aborted), reload
  every weight in place from the exported directory (``/collective_rpc`` ``reload_weights``), and
  resume it. Needs vLLM's RL/dev endpoints (``VLLM_SERVER_DEV_MODE=1``; bind it to loopback);

then set the proxy's policy version and open the gate. Each swap returns the seconds it took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from infra.proxy_client import ProxyAdmin
from schemas.errors import ServiceError
from schemas.registry import choose


class SyncMode(StrEnum):
    """How new weights reach vLLM."""

    LORA = "lora"  # hot-load the LoRA adapter in place
    FULL = "full"  # drain, reload every weight, resume


@dataclass
class WeightSync:
    vllm_url: str
    lora_name: str = "policy"
    proxy_url: str | None = None
    admin_token: str | None = None
    timeout: float = 120.0
    mode: SyncMode = SyncMode.LORA
    _proxy: ProxyAdmin | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.mode = choose(SyncMode, self.mode, "weight-sync mode")
        if self.proxy_url is not None:
            self._proxy = ProxyAdmin(self.proxy_url, self.admin_token, timeout=self.timeout)

    def _vllm(self, path: str, hint: str, **kwargs: Any) -> httpx.Response:
        resp = httpx.post(f"{self.vllm_url}{path}", timeout=self.timeout, **kwargs)
        if resp.status_code >= 400:
            raise ServiceError(
                f"vLLM {path} failed ({resp.status_code}): {resp.text[:300]}. {hint}"
            )
        return resp

    def load(self, adapter_dir: Path) -> None:
        """Load a LoRA adapter as ``lora_name``, replacing the one served under that name."""
        self._vllm(
            "/v1/load_lora_adapter",
            "Start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.",
            json={"lora_name": self.lora_name, "lora_path": str(adapter_dir), "load_inplace": True},
        )

    def load_full(self, weights_dir: Path) -> None:
        """Reload all of vLLM's weights from a Hugging Face directory, in-flight requests first
        finishing on the old ones."""
        hint = "Start vLLM with VLLM_SERVER_DEV_MODE=1 (our VLLMServer does)."
        self._vllm("/pause", hint, params={"mode": "wait"})
        try:
            self._vllm(
                "/collective_rpc",
                hint,
                json={"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}},
            )
        finally:
            self._vllm("/resume", hint)

    def swap(self, weights: Path, policy_version: int) -> float:
        """Serve ``weights`` (an adapter or a full model, per ``mode``) as ``policy_version``;
        returns the seconds taken."""
        t0 = time.perf_counter()
        if self._proxy is not None:
            self._proxy.pause()
        try:
            if self.mode is SyncMode.FULL:
                self.load_full(weights)
            else:
                self.load(weights)
            if self._proxy is not None:
                self._proxy.set_policy_version(policy_version)
        finally:
            if self._proxy is not None:
                self._proxy.resume()
        return time.perf_counter() - t0
