"""Test helpers: run the real proxy app under uvicorn in a thread, read back its events."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette

from infra.eventlog import EVENTS_TOPIC, EventLogWriter, open_reader
from infra.proxy_client import ProxyAdmin
from openforge.threaded import serve_in_thread
from proxy.app import create_app
from proxy.config import ProxyConfig
from proxy.publisher import Publisher
from proxy.state import ProxyState
from schemas.codec import Record, decode_message
from schemas.completion import CompletionEvent


@dataclass
class RunningProxy:
    url: str
    config: ProxyConfig
    app: Starlette
    unix_socket: Path | None = None

    @property
    def state(self) -> ProxyState:
        """The app's live state (set once its lifespan has started)."""
        state: ProxyState = self.app.state.proxy
        return state

    @property
    def publisher(self) -> Publisher:
        """The app's publisher (its recorder's)."""
        return self.state.recorder.publisher

    def flush(self) -> None:
        assert self.publisher.wait_idle(30)

    @property
    def admin_headers(self) -> dict[str, str]:
        """The admin credential (the proxy generated it at start when the config had none)."""
        return {"authorization": f"Bearer {self.config.admin_token}"}

    @property
    def admin(self) -> ProxyAdmin:
        return ProxyAdmin(self.url, self.config.admin_token)

    def register(self, rollout_id: str, **fields: object) -> dict[str, str]:
        resp = httpx.post(
            f"{self.url}/admin/rollouts",
            json={"rollout_id": rollout_id, **fields},
            headers=self.admin_headers,
        )
        resp.raise_for_status()
        return dict(resp.json())


@contextmanager
def running_proxy(
    config: ProxyConfig,
    unix_socket: Path | None = None,
    open_log: Callable[[], EventLogWriter] | None = None,
    host: str = "127.0.0.1",
) -> Iterator[RunningProxy]:
    """The proxy app served in a thread on ``host``; ``open_log`` opens its event log writer
    (default: the one ``config.log_url`` names)."""
    app = create_app(config, open_log)
    with serve_in_thread(app, "proxy", unix_socket=unix_socket, host=host) as url:
        yield RunningProxy(url, config, app, unix_socket)


def read_events(
    log_url: str, group: str = "tests", want: int = 1, timeout: float = 20.0
) -> list[Record]:
    """All records in the events topic (waits until at least ``want`` are there)."""
    out: list[Record] = []
    with open_reader(log_url, [EVENTS_TOPIC], group=group) as reader:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in reader.poll(max_records=1000, timeout=0.5):
                out += decode_message(rec.value)
            if len(out) >= want:
                # Drain whatever else is already there.
                for rec in reader.poll(max_records=1000, timeout=0.5):
                    out += decode_message(rec.value)
                break
    return out


def completions_of(records: list[Record], rollout_id: str | None = None) -> list[CompletionEvent]:
    events = [r for r in records if isinstance(r, CompletionEvent)]
    if rollout_id is not None:
        events = [e for e in events if e.rollout_id == rollout_id]
    return sorted(events, key=lambda e: e.call_index)


def proxy_config(upstream: str, tmp: Path, log_url: str | None = None, **kw: object) -> ProxyConfig:
    return ProxyConfig(
        upstream_url=upstream,
        log_url=log_url or f"local:{tmp / 'events'}",
        spool_dir=tmp / "spool",
        **kw,  # type: ignore[arg-type]
    )
