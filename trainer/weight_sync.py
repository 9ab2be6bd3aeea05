"""Hand new weights to vLLM without aborting in-flight requests, then bump the policy version.

Order: gate the proxy (new requests wait, or get 429 with Retry-After: the proxy's setting);
hot-load the LoRA adapter in place (``/v1/load_lora_adapter``, ``load_inplace``: requests already
running finish on the weights they started with); set the proxy's policy version; open the gate.
The time each swap takes is returned and logged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from schemas.errors import ServiceError


@dataclass
class WeightSync:
    vllm_url: str
    lora_name: str = "policy"
    proxy_url: str | None = None
    admin_token: str | None = None
    timeout: float = 120.0

    def _admin(self, path: str, body: dict[str, object] | None = None) -> None:
        if self.proxy_url is None:
            return
        headers = {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        resp = httpx.post(
            f"{self.proxy_url}{path}", json=body, headers=headers, timeout=self.timeout
        )
        if resp.status_code >= 400:
            raise ServiceError(f"proxy {path} failed ({resp.status_code}): {resp.text[:300]}")

    def load(self, adapter_dir: Path) -> None:
        resp = httpx.post(
            f"{self.vllm_url}/v1/load_lora_adapter",
            json={"lora_name": self.lora_name, "lora_path": str(adapter_dir), "load_inplace": True},
            timeout=self.timeout,
        )
        if resp.status_code >= 400:
            raise ServiceError(
                f"vLLM refused the adapter ({resp.status_code}): {resp.text[:300]}. Start it with "
                "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True."
            )

    def swap(self, adapter_dir: Path, version: int) -> float:
        """Load ``adapter_dir`` as the policy, stamp ``version``; returns seconds taken."""
        t0 = time.perf_counter()
        self._admin("/admin/pause")
        try:
            self.load(adapter_dir)
            self._admin("/admin/policy", {"version": version})
        finally:
            self._admin("/admin/resume")
        return time.perf_counter() - t0
