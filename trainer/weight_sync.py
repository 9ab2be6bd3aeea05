"""Hand new weights to vLLM, then bump the policy version: every token of a call the proxy
records comes from the policy version stamped on that call.

The proxy stamps a call with the policy version when the call starts. vLLM does not keep a
running request on the weights it started with. An in-place LoRA reload (``load_inplace``)
keeps the adapter's id, and at every step each worker re-applies, per adapter id, the request
for it that joined the batch last (and, as vLLM keeps ``load_inplace`` on it, re-reads it from
that one's path: ``add_adapter`` in vLLM's ``lora/worker_manager.py``): once a call started
after the reload joins the batch, the calls still running from before decode on the new adapter
too. A full reload changes every weight. So a swap never changes weights under a call in flight:

1. gate and drain the proxy: new calls wait (or get 429 with Retry-After: the proxy's setting),
   and the swap waits, at most ``drain_timeout`` seconds, until every call admitted before the
   gate has ended and been recorded (``POST /admin/pause`` with ``drain_s``). If one is still
   running then, the weights are left as they were: :class:`ServiceError`;
2. change the weights:

   - ``lora``: hot-load the adapter in place (``/v1/load_lora_adapter`` with ``load_inplace``).
     Export each version to a new directory: vLLM keys its prefix cache by the adapter's path,
     so blocks computed with the old weights could be reused after a reload from the same path;
   - ``full``: drain vLLM as well (``/pause?mode=wait``: running requests, also those that did
     not come through the proxy, finish; none is aborted), reload every weight in place from
     the exported directory (``/collective_rpc`` ``reload_weights``), and resume it. Needs
     vLLM's RL/dev endpoints (``VLLM_SERVER_DEV_MODE=1``; bind it to loopback);

3. set the proxy's policy version and open the gate: calls admitted from then on carry the new
   version and reach vLLM once the new weights are in place.

A proxy that cannot be reached (restarting, as a Deployment's pod does) is retried for up to
``proxy_wait`` seconds at each of steps 1 and 3: a proxy restarted mid-swap starts paused and
at its previous version (``proxy.swap_state``), so it serves no call until the retried step 3
has set the new version and opened the gate.

If the proxy's pause ran out (its ``pause_timeout``) before step 3, calls may have started in
between with the old version on the new weights: the swap opens the gate and raises
:class:`ServiceError` saying so. Without a proxy (``proxy_url`` None) nothing is gated or
stamped, and in ``lora`` mode a request sent straight to vLLM may see the weights change
mid-generation. Each swap returns the seconds it took, the drain included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx

from infra.proxy_client import ProxyAdmin, ProxyUnreachable
from schemas.errors import ServiceError
from schemas.registry import choose

logger = logging.getLogger(__name__)


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
    drain_timeout: float = 120.0  # seconds a swap waits for the proxy's calls in flight to end
    proxy_wait: float = 120.0  # seconds an unreachable proxy is retried (a restart)
    start_wait: float = 900.0  # seconds a trainer waits at start for vLLM to come up
    _proxy: ProxyAdmin | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.mode = choose(SyncMode, self.mode, "weight-sync mode")
        if self.proxy_url is not None:
            self._proxy = ProxyAdmin(self.proxy_url, self.admin_token, timeout=self.timeout)

    def wait_for_vllm(self) -> None:
        """Return once vLLM answers ``/health`` (a trainer started beside vLLM, which takes
        minutes to load its model); ServiceError after ``start_wait`` seconds."""
        deadline, said = time.monotonic() + self.start_wait, False
        while True:
            try:
                if httpx.get(f"{self.vllm_url}/health", timeout=5.0).status_code == 200:
                    return
                why = "it is not ready yet"
            except httpx.HTTPError as exc:
                why = f"it cannot be reached ({type(exc).__name__})"
            if time.monotonic() >= deadline:
                raise ServiceError(
                    f"vLLM at {self.vllm_url} did not come up within {self.start_wait:g} s "
                    f"({why}): start it, or check --vllm"
                )
            if not said:
                logger.info("waiting for vLLM at %s: %s", self.vllm_url, why)
                said = True
            time.sleep(2.0)

    def _vllm(self, path: str, hint: str, **kwargs: Any) -> httpx.Response:
        resp = httpx.post(f"{self.vllm_url}{path}", timeout=self.timeout, **kwargs)
        if resp.status_code >= 400:
            raise ServiceError(
                f"vLLM {path} failed ({resp.status_code}): {resp.text[:300]}. {hint}"
            )
        return resp

    def load(self, adapter_dir: Path, name: str | None = None) -> None:
        """Load a LoRA adapter as ``name`` (default ``lora_name``), replacing the one served
        under that name."""
        body = {"lora_name": name or self.lora_name, "lora_path": str(adapter_dir)}
        self._vllm(
            "/v1/load_lora_adapter",
            "Start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.",
            json={**body, "load_inplace": True},
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
        """Serve ``weights`` (an adapter or a full model, per ``mode``) as ``policy_version``,
        once the proxy's calls in flight have ended; returns the seconds taken."""
        t0 = time.perf_counter()
        if self._proxy is None:
            self._change(weights)
            return time.perf_counter() - t0
        proxy = self._proxy
        gate = self._retried(lambda: proxy.pause(drain=self.drain_timeout))
        try:
            if gate["in_flight"] or not gate["paused"]:
                why = (
                    f"{gate['in_flight']} calls were still in flight on the proxy "
                    f"{self.drain_timeout:g} s after it was paused"
                    if gate["paused"]
                    else "the proxy's pause ended by its own timeout while the swap waited for "
                    "its calls in flight"
                )
                raise ServiceError(
                    f"{why}: the weights were not changed (policy version {policy_version} is "
                    "not served), since every token of a call must come from the version "
                    "stamped on it. Raise WeightSync.drain_timeout (and the proxy's "
                    "pause_timeout), or bound calls with the proxy's max_tokens_cap."
                )
            self._change(weights)
            state = self._retried(lambda: proxy.set_policy_version(policy_version))
        finally:
            self._retried(proxy.resume)
        if not state["paused"]:
            raise ServiceError(
                f"the proxy's pause ended by its own timeout (pause_timeout) before weight swap "
                f"to policy version {policy_version} was done: calls that started meanwhile may "
                "carry the previous version on the new weights. Give the proxy a longer "
                "pause_timeout."
            )
        return time.perf_counter() - t0

    def _retried(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``call`` on the proxy, retried while it cannot be reached, up to ``proxy_wait`` s."""
        deadline = time.monotonic() + self.proxy_wait
        while True:
            try:
                return call()
            except ProxyUnreachable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def _change(self, weights: Path) -> None:
        if self.mode is SyncMode.FULL:
            self.load_full(weights)
        else:
            self.load(weights)
