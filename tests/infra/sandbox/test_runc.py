"""The runc container sandbox, with real runc, a real image from the local store and real
processes: the image's files and user, a fresh writable layer per run, only the proxy reachable,
limits, the deadline, and nothing left behind (no process, mount, cgroup or state)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.images import ImageStore
from infra.sandbox import (
    Limits,
    Mount,
    ProxyEndpoint,
    RootFs,
    RuncSandbox,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.cgroups import ROOT as CGROUPS
from schemas.errors import ConfigError
from tests.infra.sandbox.usage import check_usage_is_counted

IMAGE = "localhost/python:3.11-slim"  # made by `scripts/setup images`


@pytest.fixture(scope="module")
def image_root() -> Path:
    store = ImageStore()
    assert store.exists(IMAGE), f"{IMAGE} is missing: run `scripts/setup images`"
    return store.rootfs(IMAGE)


class Run:
    def __init__(self, backend: RuncSandbox, root: Path, tmp: Path) -> None:
        self.backend, self.root, self.tmp = backend, root, tmp
        self.workspace = tmp / "workspace"
        self.workspace.mkdir()
        self.mark = uuid.uuid4().hex

    def __call__(self, *argv: str, uid: int = 0, **kw: Any) -> SandboxResult:
        spec = SandboxSpec(
            argv=argv,
            stdout=self.tmp / "out.txt",
            stderr=self.tmp / "err.txt",
            cwd="/app",
            env={"MARK": self.mark, **kw.pop("env", {})},
            mounts=kw.pop("mounts", (Mount(self.workspace, "/app", read_only=False),)),
            root=RootFs(self.root, uid, uid),
            **kw,
        )
        return self.backend.run(spec)

    @property
    def out(self) -> str:
        return (self.tmp / "out.txt").read_text()

    @property
    def err(self) -> str:
        return (self.tmp / "err.txt").read_text()

    def marked(self) -> list[int]:
        needle = f"MARK={self.mark}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
        return found


@pytest.fixture
def run(image_root: Path, tmp_path: Path) -> Run:
    return Run(RuncSandbox(state=tmp_path / "state"), image_root, tmp_path)


def _nothing_left(run: Run) -> None:
    assert run.marked() == []
    state = run.backend.state
    assert not any((state / "runs").iterdir()) if (state / "runs").exists() else True
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts
    for controller in ("memory", "pids", "cpu"):
        group = CGROUPS / controller / "openforge"
        if group.is_dir():
            assert [p.name for p in group.iterdir() if p.is_dir()] == [], controller


def test_the_image_its_user_and_a_fresh_layer_per_run(run: Run) -> None:
    first = run(
        "sh", "-c", "id -u; python --version; echo kept > /app/ws.txt; echo gone > /etc/mine"
    )
    assert first.ok, (first, run.err)
    assert run.out.splitlines() == ["0", "Python 3.11.2"]
    assert (run.workspace / "ws.txt").read_text() == "kept\n"  # the workspace is the host's
    second = run("sh", "-c", "cat /etc/mine 2>/dev/null || echo absent; id -u", uid=1000)
    assert second.ok and run.out.splitlines() == ["absent", "1000"]
    assert not (run.root / "etc" / "mine").exists()  # the image itself is never written
    _nothing_left(run)


def test_the_cpu_time_and_memory_a_run_used_are_counted(run: Run) -> None:
    check_usage_is_counted(run, lambda: run.err)
    _nothing_left(run)


def test_exit_codes_signals_and_a_missing_command(run: Run) -> None:
    assert run("sh", "-c", "exit 42").exit_code == 42
    # Not the container's first process (pid 1 ignores a signal it has no handler for).
    assert run("sh", "-c", "sh -c 'kill -TERM $$'").exit_code == 128 + 15
    missing = run("no-such-command")
    assert missing.outcome is SandboxOutcome.FAILED_TO_START
    assert "no-such-command" in missing.message and "executable file not found" in missing.message
    with pytest.raises(ConfigError, match="RootFs"):
        run.backend.run(SandboxSpec(argv=("true",), stdout=run.tmp / "o", stderr=run.tmp / "e"))
    _nothing_left(run)


@pytest.fixture
def unix_http(tmp_path: Path) -> Iterator[Path]:
    """A one-line HTTP answer on a host Unix socket (the proxy's stand-in for this test only)."""
    path = tmp_path / "proxy.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            request = conn.recv(4096)
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nproxied " + request.split(b" ")[1])
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


@pytest.fixture
def host_tcp() -> Iterator[tuple[int, list[object]]]:
    accepted: list[object] = []
    server = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


CLIENT = """
import socket, sys, urllib.request
for target in [("127.0.0.1", int(sys.argv[1])), ("10.0.0.1", 80)]:
    try:
        socket.create_connection(target, timeout=2)
        print("CONNECTED", target)
    except OSError as exc:
        print("blocked", type(exc).__name__)
print(urllib.request.urlopen("http://127.0.0.1:18080/v1/models", timeout=10).read().decode())
"""


def test_only_the_proxy_is_reachable(
    run: Run, unix_http: Path, host_tcp: tuple[int, list[object]]
) -> None:
    port, accepted = host_tcp
    (run.workspace / "client.py").write_text(CLIENT)
    result = run("python3", "/app/client.py", str(port), proxy=ProxyEndpoint(unix_http, 18080))
    assert result.ok, (result, run.err)
    assert run.out.count("blocked") == 2 and "CONNECTED" not in run.out
    assert run.out.splitlines()[-1] == "proxied /v1/models"
    assert accepted == []  # the host's loopback server never saw the container
    assert not (run.root / unix_http.name).exists()
    _nothing_left(run)


def test_limits_strike_and_are_reported(run: Run) -> None:
    hog = run("python3", "-c", "b = bytearray(512 * 2**20)", limits=Limits(memory_mib=64))
    assert hog.outcome is SandboxOutcome.OUT_OF_MEMORY and hog.oom_kills, (hog, run.err)
    assert hog.peak_memory_mib is not None and hog.peak_memory_mib <= 64.5
    spawn = "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; wait"
    forks = run("sh", "-c", spawn, limits=Limits(max_processes=16))
    assert forks.outcome is SandboxOutcome.TOO_MANY_PROCESSES and forks.fork_failures
    quota = "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || echo none"
    assert run("sh", "-c", quota, limits=Limits(cpus=0.5)).ok
    _nothing_left(run)


def test_the_deadline_and_cancel_kill_everything(run: Run) -> None:
    timed = run("sh", "-c", "setsid sleep 1000 & sleep 1000", timeout_s=1.5)
    assert timed.outcome is SandboxOutcome.TIMED_OUT and timed.exit_code is None
    _nothing_left(run)
    timer = threading.Timer(1.0, run.backend.cancel)
    timer.start()
    cancelled = run("sh", "-c", "sleep 1000 & wait")
    timer.join()
    assert cancelled.exit_code == 128 + 9 and cancelled.duration_s < 30
    _nothing_left(run)
    # The caller stopped before the container was there (cancel() raced with its start).
    stop = threading.Event()
    stop.set()
    late = run("sh", "-c", "sleep 1000 & wait", cancelled=stop)
    assert late.exit_code == 128 + 9 and late.duration_s < 30
    _nothing_left(run)
    assert os.path.isdir(run.root / "etc")


def test_collect_copies_paths_out_and_never_follows_a_link_out_of_the_tree(
    run: Run, tmp_path: Path
) -> None:
    out = tmp_path / "collected"
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "key").write_text("host only\n")
    script = (
        "mkdir -p /var/log/app && echo kept > /var/log/app/a.log && echo tmp > /var/log/app/x.tmp"
        f" && echo ws > /app/w.txt && rm -rf /srv && ln -s {secret} /srv"
    )
    collect = (
        ("/var/log/app", out / "logs", ("*.tmp",)),
        ("/app/w.txt", out / "app" / "w.txt", ()),
        ("/srv/key", out / "srv" / "key", ()),  # /srv is now a link to a host directory
        ("/nowhere", out / "nowhere", ()),
    )
    result = run("sh", "-c", script, collect=collect)
    assert result.ok, (result, run.err)
    assert (out / "logs" / "a.log").read_text() == "kept\n"
    assert not (out / "logs" / "x.tmp").exists()
    assert (out / "app" / "w.txt").read_text() == "ws\n"
    assert not (out / "srv").exists() and not (out / "nowhere").exists()
    _nothing_left(run)
