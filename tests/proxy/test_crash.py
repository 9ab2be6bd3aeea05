"""The proxy-crash guarantee: SIGKILL the proxy process under load; every call whose response
completed is in the event log (the proxy restarted on the same log and spool)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from infra.local.process import ServiceProcess, free_port
from openforge.testing import fast_upstream
from openforge.testing.proxy import completions_of, read_events
from openforge.threaded import serve_in_thread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _proxy(upstream: str, tmp: Path, port: int, log: str) -> ServiceProcess:
    argv = [
        sys.executable, "-m", "openforge", "proxy", "--upstream", upstream, "--log", log,
        "--spool", str(tmp / "spool"), "--port", str(port), "--auto-register",
        "--admin-token", "adm",
    ]  # fmt: skip
    return ServiceProcess("proxy", argv, tmp / f"proxy-{time.monotonic_ns()}.log")


def _client(url: str, n: int, stop: threading.Event, served: list[str]) -> None:
    """Calls until ``stop``, alternating plain and streamed; a response counts as served only
    when it arrived whole (a JSON body, or a stream through its ``[DONE]``)."""
    with httpx.Client(timeout=30) as client:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                if i % 2:
                    resp = client.post(f"{url}/rollout/c{n}/v1/chat/completions", json=CHAT)
                    if resp.status_code == 200:
                        served.append(resp.json()["id"])
                    continue
                body = {**CHAT, "stream": True}
                with client.stream(
                    "POST", f"{url}/rollout/c{n}/v1/chat/completions", json=body
                ) as resp:
                    text = b"".join(resp.iter_bytes()).decode()
                if resp.status_code == 200 and text.endswith("data: [DONE]\n\n"):
                    first = json.loads(text.split("data: ", 2)[1])
                    served.append(first["id"])
            except httpx.HTTPError:
                time.sleep(0.01)  # the proxy is gone (or not back yet)


def test_a_sigkilled_proxy_loses_no_call_it_answered(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = f"local:{tmp_path / 'events'}"
    app = fast_upstream.create_app(str(tiny_model_dir), 8, token_delay=0.002)
    with serve_in_thread(app, "upstream") as upstream:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proxy = _proxy(upstream, tmp_path, port, log)
        proxy.start()

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            proxy.wait_ready(ready, 120)
            stop, served = threading.Event(), []  # type: ignore[var-annotated]
            clients = [
                threading.Thread(target=_client, args=(url, n, stop, served)) for n in range(8)
            ]
            for c in clients:
                c.start()
            deadline = time.monotonic() + 30
            while len(served) < 150 and time.monotonic() < deadline:
                time.sleep(0.05)
            pid = proxy.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # mid-load: calls in flight die with it
            stop.set()
            for c in clients:
                c.join(60)
        finally:
            proxy.stop()
        # The same log and spool: whatever waited in the spool is replayed.
        again = _proxy(upstream, tmp_path, port, log)
        again.start()
        try:
            again.wait_ready(ready, 120)
            time.sleep(1)
        finally:
            again.stop()
    records = read_events(log, group="crash", want=10**9, timeout=3)
    recorded = {
        json.loads(e.response_body)["id"]
        for n in range(8)
        for e in completions_of(records, f"c{n}")
        if e.response_body is not None
    }
    lost = set(served) - recorded
    print(f"SIGKILL: served {len(served)}, recorded {len(recorded)}, lost {len(lost)}")
    assert len(served) >= 150
    assert not lost
