"""What the services-apart tests share: their config, the simulated users, and waiting on the
services (which fails at once if one of them exited)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from infra.local.process import free_port
from infra.local.vllm import VLLMServer
from openforge.query.lineage import consumed
from openforge.serve.apart import ApartConfig, ServicesApart
from openforge.traffic.simulate import TrafficConfig, TrafficReport, run

# The pipeline's deadline, after a session's latest event: above the longest gap between its
# events (a proxy restart, retried through; vLLM's first LoRA call, warmed up before; a call
# held by a weight swap while the trainer and two pipeline jobs share the 2 cores: 15 s was
# once too short) and the session idle time plus the feedback delay.
LATENESS_S = 25.0


def until(what: str, done: Callable[[], bool], services: ServicesApart, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        services.check_alive()
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def at_least(out: Path, updates: int) -> bool:
    """Whether the trainer under ``out`` has made ``updates`` updates."""
    return len(consumed(out / "trainer" / "consumed.jsonl")) >= updates


def served_latest(services: ServicesApart, out: Path, timeout: float = 120) -> int:
    """The served policy version once it is the latest the trainer handed out. A version is
    recorded in ``versions.jsonl`` *before* its swap, so the proxy may stamp the one before it
    for a moment; wait for the swap rather than read in between."""

    def latest() -> int:
        lines = (out / "trainer" / "versions.jsonl").read_text().splitlines()
        return max((int(json.loads(line)["version"]) for line in lines if line.strip()), default=0)

    until("the latest version served", lambda: services.policy_version() == latest(), services,
          timeout=timeout)  # fmt: skip
    return services.policy_version()


def apart_config(
    url: str, vllm: VLLMServer, model_dir: Path, out: Path, **overrides: Any
) -> ApartConfig:
    """Sessions idle after 1.5 s, the deadline above, an update as soon as an episode is ready,
    and every episode admitted however old (sessions that straddle restarts are old)."""
    settings: dict[str, Any] = {
        "port": free_port(), "session_idle_s": 1.5, "lateness_s": LATENESS_S, "lr": 1e-2,
        "max_staleness": 1000, "episodes_per_update": None, **overrides,
    }  # fmt: skip
    return ApartConfig(url, vllm.base_url, model_dir, out, **settings)


def traffic(
    services: ServicesApart, stop: threading.Event, out: dict[str, TrafficReport]
) -> threading.Thread:
    cfg = TrafficConfig(
        services.config.proxy_url,
        users=2,
        sessions=None,  # until the test says stop
        turns=2,
        feedback_fraction=0.7,
        feedback_delay_s=(2.0, 4.0),  # after the session's last answer: the proxy ends it at 1.5 s
        think_s=1.0,
        max_tokens=8,
        feedback_token=services.feedback_token,
    )
    thread = threading.Thread(target=lambda: out.update(report=run(cfg, lambda: not stop.is_set())))
    thread.start()
    return thread


def warm_up(vllm: VLLMServer) -> None:
    """One call on the adapter straight to vLLM (not recorded): its first LoRA call compiles."""
    body = {"model": "policy", "prompt": "hi", "max_tokens": 1}
    httpx.post(f"{vllm.base_url}/v1/completions", json=body, timeout=120).raise_for_status()
