"""The bubblewrap sandbox, with real bwrap and real processes: what a command can see, reach and
leave behind, and how each way of ending is reported."""

from __future__ import annotations

import http.server
import json
import os
import socket
import socketserver
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from infra.local.process import processes_of
from infra.sandbox import (
    BubblewrapSandbox,
    LimitEnforcement,
    Limits,
    Mount,
    ProxyEndpoint,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
    sandbox,
)
from infra.sandbox.cgroups import unavailable
from schemas.errors import ConfigError, SetupError
from tests.infra.sandbox.usage import check_usage_is_counted

REPO = Path(__file__).resolve().parents[3]
MARK = "OPENFORGE_TEST_MARK"


@pytest.fixture(scope="module")
def backend() -> BubblewrapSandbox:
    return BubblewrapSandbox()


@pytest.fixture
def rollout(tmp_path: Path) -> Path:
    """A rollout directory with a workspace and tests, and a sibling rollout holding a secret."""
    (tmp_path / "rollout-a" / "workspace").mkdir(parents=True)
    (tmp_path / "rollout-a" / "tests").mkdir()
    (tmp_path / "rollout-a" / "tests" / "test_task.py").write_text("assert True\n")
    (tmp_path / "rollout-b" / "workspace").mkdir(parents=True)
    (tmp_path / "rollout-b" / "workspace" / "secret.txt").write_text("other rollout\n")
    return tmp_path / "rollout-a"


class Run:
    """Runs commands in ``rollout``'s sandbox: workspace at /app (rw), tests at /tests (ro)."""

    def __init__(self, backend: BubblewrapSandbox, rollout: Path) -> None:
        self.backend, self.rollout = backend, rollout
        self.mark = uuid.uuid4().hex
        self.mounts = (
            Mount(rollout / "workspace", "/app", read_only=False),
            Mount(rollout / "tests", "/tests", read_only=True),
        )

    def __call__(self, *argv: str, **kw: Any) -> SandboxResult:
        env = {MARK: self.mark, **kw.pop("env", {})}
        spec = SandboxSpec(
            argv=argv,
            stdout=self.rollout / "out.txt",
            stderr=self.rollout / "err.txt",
            cwd="/app",
            env=env,
            mounts=kw.pop("mounts", self.mounts),
            **kw,
        )
        return self.backend.run(spec)

    @property
    def out(self) -> str:
        return (self.rollout / "out.txt").read_text()

    @property
    def err(self) -> str:
        return (self.rollout / "err.txt").read_text()

    def marked_pids(self) -> list[int]:
        """Host pids of live processes that carry this run's marker in their environment."""
        needle = f"{MARK}={self.mark}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        return found


@pytest.fixture
def run(backend: BubblewrapSandbox, rollout: Path) -> Run:
    return Run(backend, rollout)


class _PidWatch:
    """Watches from a thread while a run goes on: waits until ``count`` marked processes run on
    the host, records their pids in ``seen``, then (optionally) writes ``release``."""

    def __init__(self, run: Run, count: int, release: Path | None = None) -> None:
        self.run, self.count, self.release = run, count, release
        self.seen: list[int] = []
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        for _ in range(400):
            pids = self.run.marked_pids()
            if len(pids) >= self.count:
                self.seen = pids
                break
            threading.Event().wait(0.025)
        if self.release is not None:
            self.release.write_text("go")


def _running(pid: int) -> bool:
    """Alive and not a zombie (the sandbox's init may wait as one for the machine's init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _nothing_left(run: Run, result: SandboxResult, pids: list[int]) -> None:
    assert run.marked_pids() == []
    assert processes_of(result.sandbox_id) == []
    assert [p for p in pids if _running(p)] == []
    # No sandbox of this test process is left (the session's own services, vLLM and Kafka,
    # carry the same owner prefix and may be running: they are not looked at).
    assert [p for p in processes_of(f"{os.getpid()}.sandbox.") if _running(p)] == []


# -- files ------------------------------------------------------------------------------------


def test_workspace_is_writable_and_tests_are_read_only(run: Run) -> None:
    result = run(
        "sh",
        "-c",
        "echo made > /app/new.txt && cat /tests/test_task.py && "
        "{ echo changed > /tests/test_task.py; } 2>&1; echo rc=$?",
    )
    assert result.ok, (result, run.err)
    assert (run.rollout / "workspace" / "new.txt").read_text() == "made\n"
    assert "assert True" in run.out
    assert "Read-only file system" in run.out and "rc=2" in run.out
    assert (run.rollout / "tests" / "test_task.py").read_text() == "assert True\n"


def test_host_paths_outside_the_mounts_are_invisible(run: Run) -> None:
    sibling = run.rollout.parent / "rollout-b"
    hidden = [Path.home() / ".cache", Path("/work"), REPO, sibling, run.rollout / "workspace"]
    hidden = [p for p in hidden if p.exists()]
    assert Path("/work") in hidden and sibling in hidden  # the check below means something
    probe = "; ".join(f'[ -e "{p}" ] && echo "VISIBLE {p}"' for p in hidden)
    result = run("sh", "-c", f"{probe}; ls -A /; cat /etc/shadow; true")
    assert result.ok, (result, run.err)
    assert "VISIBLE" not in run.out
    top = set(run.out.split())
    assert {"root", "work"}.isdisjoint(top) and {"app", "tests", "usr", "etc"} <= top
    assert "root:" not in run.out and "/etc/shadow: Permission denied" in run.err  # masked


def test_home_tmp_and_environment_are_private(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENFORGE_TEST_HOST_SECRET", "s3cret")
    marker = Path(f"/tmp/openforge-host-{run.mark}")
    marker.write_text("host")
    try:
        first = run(
            "sh",
            "-c",
            'ls -A /tmp "$HOME"; echo "home=$HOME"; env; '
            'echo left > /tmp/t.txt; echo left > "$HOME/h.txt"',
        )
        assert first.ok, (first, run.err)
        assert marker.name not in run.out and "s3cret" not in run.out
        assert "home=/home/agent" in run.out
        second = run("sh", "-c", 'ls -A /tmp "$HOME"')
        assert second.ok and "t.txt" not in run.out and "h.txt" not in run.out
        assert not Path("/tmp/t.txt").exists()
    finally:
        marker.unlink()


# -- network ----------------------------------------------------------------------------------


class _Echo(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self._reply({"path": self.path, "received": len(body)}, pad=len(body))

    def do_GET(self) -> None:
        self._reply({"path": self.path}, pad=0)

    def _reply(self, doc: dict[str, Any], pad: int) -> None:
        data = json.dumps({**doc, "pad": "x" * pad}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:  # a Unix socket has no client address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def unix_http(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "proxy.sock"
    server = socketserver.ThreadingUnixStreamServer(str(path), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


@pytest.fixture
def host_tcp() -> Iterator[tuple[int, list[object]]]:
    """A TCP server on the host's 127.0.0.1 and the connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()


CLIENT = """
import json, socket, sys, urllib.request
port, host_port = int(sys.argv[1]), int(sys.argv[2])
for target in [("127.0.0.1", host_port), ("10.0.0.1", 80)]:
    try:
        socket.create_connection(target, timeout=2).close()
        print("CONNECTED", target)
    except OSError as exc:
        print("blocked", target, type(exc).__name__)
get = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10))
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat", data=b"y" * 2**20)
post = json.load(urllib.request.urlopen(req, timeout=10))
print(json.dumps({"get": get["path"], "post": post["received"], "pad": len(post["pad"])}))
sys.exit(7)
"""


def test_only_the_proxy_is_reachable(
    run: Run, unix_http: Path, host_tcp: tuple[int, list[object]]
) -> None:
    port, accepted = host_tcp
    (run.rollout / "workspace" / "client.py").write_text(CLIENT)
    proxy = ProxyEndpoint(unix_http, 18080)
    result = run("python3", "/app/client.py", "18080", str(port), proxy=proxy)
    assert result.outcome is SandboxOutcome.EXITED and result.exit_code == 7, (result, run.err)
    assert "CONNECTED" not in run.out and run.out.count("blocked") == 2
    assert accepted == []  # the host's loopback server never saw the sandbox
    doc = json.loads(run.out.splitlines()[-1])
    assert doc == {"get": "/v1/models", "post": 2**20, "pad": 2**20}
    assert proxy.base_url == "http://127.0.0.1:18080"


def test_a_missing_proxy_socket_fails_to_start(run: Run, tmp_path: Path) -> None:
    result = run("true", proxy=ProxyEndpoint(tmp_path / "absent.sock", 18080))
    assert result.outcome is SandboxOutcome.FAILED_TO_START
    assert "start the proxy" in result.message and "absent.sock" in run.err


# -- lifetime ---------------------------------------------------------------------------------


def test_background_processes_are_gone_after_run(run: Run) -> None:
    watch = _PidWatch(run, 2, release=run.rollout / "workspace" / "release")
    result = run(
        "sh",
        "-c",
        "setsid nohup sleep 1000 >/dev/null 2>&1 & "
        "while [ ! -e /app/release ]; do sleep 0.02; done",
    )
    watch.thread.join()
    assert result.ok, (result, run.err)
    assert len(watch.seen) >= 2  # the shell and its daemon were seen running on the host
    _nothing_left(run, result, watch.seen)


def test_timeout_kills_the_whole_sandbox(run: Run) -> None:
    watch = _PidWatch(run, 3)
    # Long enough for the watcher to see all three under load (the suite runs vLLM meanwhile).
    result = run("sh", "-c", "sleep 1000 & setsid sleep 1000 & wait", timeout_s=4.0)
    watch.thread.join()
    assert result.outcome is SandboxOutcome.TIMED_OUT and result.exit_code is None
    assert 4.0 <= result.duration_s < 15.0
    assert len(watch.seen) >= 3  # the shell and both sleeps were seen running on the host
    _nothing_left(run, result, watch.seen)


def test_exit_codes_and_signals_propagate(run: Run) -> None:
    assert run("sh", "-c", "exit 42").exit_code == 42
    killed = run("sh", "-c", "kill -TERM $$")
    assert killed.outcome is SandboxOutcome.EXITED and killed.exit_code == 128 + 15
    assert run("true").ok


# -- limits -----------------------------------------------------------------------------------


@pytest.fixture
def cgroups_v1() -> None:
    """The limit tests need per-sandbox cgroups (this machine kind and CI have them); where they
    are missing the tests fail saying so, rather than skip."""
    why = unavailable()
    assert why is None, f"cgroup v1 limits are not available here: {why}"


needs_cgroups = pytest.mark.usefixtures("cgroups_v1")


@needs_cgroups
def test_memory_hog_is_out_of_memory(run: Run) -> None:
    hog = "b = bytearray(512 * 2**20); print('survived')"
    result = run("python3", "-c", hog, limits=Limits(memory_mib=64))
    assert result.outcome is SandboxOutcome.OUT_OF_MEMORY, (result, run.err)
    assert result.exit_code == 128 + 9 and result.oom_kills and result.oom_kills >= 1
    assert "survived" not in run.out
    assert result.peak_memory_mib is not None and result.peak_memory_mib <= 64.5


@needs_cgroups
def test_the_cpu_time_and_memory_a_run_used_are_counted(run: Run) -> None:
    check_usage_is_counted(run, lambda: run.err)


@needs_cgroups
def test_spawning_past_the_process_limit_is_too_many_processes(run: Run) -> None:
    spawn = (
        "import subprocess\nkids = []\n"
        "try:\n    while len(kids) < 500:\n"
        "        kids.append(subprocess.Popen(['sleep', '1000']))\n"
        "except OSError as exc:\n"
        "    print('refused after', len(kids), exc)\n    raise SystemExit(3)\n"
    )
    result = run("python3", "-c", spawn, limits=Limits(max_processes=24))
    assert result.outcome is SandboxOutcome.TOO_MANY_PROCESSES, (result, run.err, run.out)
    assert result.exit_code == 3 and result.fork_failures and result.fork_failures >= 1
    assert int(run.out.split()[2]) < 24
    _nothing_left(run, result, [])


@needs_cgroups
def test_a_fork_bomb_is_bounded_and_cleared(run: Run) -> None:
    bomb = "b() { b | b & }; b; sleep 100"
    result = run("sh", "-c", bomb, limits=Limits(max_processes=32), timeout_s=2.0)
    assert result.outcome in (SandboxOutcome.TIMED_OUT, SandboxOutcome.TOO_MANY_PROCESSES)
    assert result.fork_failures and result.fork_failures > 0
    _nothing_left(run, result, [])


def test_rlimit_fallback_bounds_memory_and_cleans_up(rollout: Path) -> None:
    run = Run(BubblewrapSandbox(limits_by=LimitEnforcement.RLIMIT), rollout)
    hog = "b = bytearray(512 * 2**20); print('survived')"
    result = run("python3", "-c", hog, limits=Limits(memory_mib=128))
    assert result.outcome is SandboxOutcome.EXITED and result.exit_code == 1
    assert "MemoryError" in run.err and result.oom_kills is None
    bg = run("sh", "-c", "setsid nohup sleep 1000 >/dev/null 2>&1 &")
    assert bg.ok
    _nothing_left(run, bg, [])


# -- failing to start, set-up and configuration -----------------------------------------------


def test_missing_binary_fails_to_start_with_a_clear_message(run: Run) -> None:
    result = run("no-such-tool", "--help")
    assert result.outcome is SandboxOutcome.FAILED_TO_START and result.exit_code is None
    assert "'no-such-tool'" in result.message and "mount the directory" in result.message
    assert "no-such-tool" in run.err
    by_path = run("./missing.sh")
    assert by_path.outcome is SandboxOutcome.FAILED_TO_START and "cwd /app" in by_path.message


def test_a_mount_bwrap_cannot_make_fails_to_start(run: Run) -> None:
    """Caught by bwrap itself, not the pre-check: a mount point under the read-only /usr."""
    mounts = (Mount(run.rollout / "workspace", "/usr/no-such-dir/app"),)
    result = run("true", mounts=mounts)
    assert result.outcome is SandboxOutcome.FAILED_TO_START, (result, run.err)
    assert "bwrap:" in result.message and "/usr/no-such-dir" in result.message


def test_missing_or_broken_bwrap_is_a_setup_error(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENFORGE_BWRAP", str(tmp_path / "absent-bwrap"))
    with pytest.raises(SetupError, match="scripts/setup"):
        run("true")
    fake = tmp_path / "fake-bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("OPENFORGE_BWRAP", str(fake))
    with pytest.raises(SetupError, match="No permissions to create new namespace"):
        run("true")


def test_specs_are_validated_and_backends_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="absolute"):
        Mount(tmp_path, "app")
    with pytest.raises(ConfigError, match="/proc"):
        Mount(tmp_path, "/proc/x")
    with pytest.raises(ConfigError, match="argv is empty"):
        SandboxSpec(argv=(), stdout=tmp_path / "o", stderr=tmp_path / "e")
    with pytest.raises(ConfigError, match="port"):
        ProxyEndpoint(tmp_path / "s.sock", 0)
    assert isinstance(sandbox("bubblewrap"), BubblewrapSandbox)
    with pytest.raises(ConfigError, match="bubblewrap"):
        sandbox("docker")


def test_the_run_is_in_new_namespaces(run: Run) -> None:
    names = ("pid", "net", "mnt", "user", "ipc", "uts")
    result = run("sh", "-c", "readlink " + " ".join(f"/proc/self/ns/{n}" for n in names))
    assert result.ok, (result, run.err)
    inside = run.out.split()
    outside = [os.readlink(f"/proc/self/ns/{n}") for n in names]
    assert len(inside) == len(names)
    assert all(i != o for i, o in zip(inside, outside, strict=True)), (inside, outside)


def test_concurrent_runs_from_threads_stay_apart(
    backend: BubblewrapSandbox, tmp_path: Path
) -> None:
    """Rollouts run side by side (``asyncio.to_thread`` style): each sees only its own files
    and processes, and all of them are cleaned up."""
    runs = []
    for i in range(4):
        (tmp_path / f"r{i}" / "workspace").mkdir(parents=True)
        (tmp_path / f"r{i}" / "tests").mkdir()
        runs.append(Run(backend, tmp_path / f"r{i}"))
    script = "echo $N > /app/mine; sleep 0.3; ls /proc | grep -c '^[0-9]'; ls -A /app"
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(r, "sh", "-c", script, env={"N": str(i)}) for i, r in enumerate(runs)
        ]
        results = [f.result() for f in futures]
    for i, (r, result) in enumerate(zip(runs, results, strict=True)):
        assert result.ok, (result, r.err)
        assert (r.rollout / "workspace" / "mine").read_text() == f"{i}\n"
        count, *files = r.out.split()
        assert files == ["mine"] and int(count) <= 6  # bwrap's init, sh, sleep/ls/grep: no others
        _nothing_left(r, result, [])
    assert len({result.namespaces["pid"] for result in results}) == 4


def test_cancel_kills_the_running_sandboxes(run: Run) -> None:
    watch = _PidWatch(run, 2)
    results: list[SandboxResult] = []
    runner = threading.Thread(
        target=lambda: results.append(run("sh", "-c", "sleep 1000 & wait", timeout_s=120))
    )
    runner.start()
    watch.thread.join()
    assert len(watch.seen) >= 2  # the shell and its sleep are running
    run.backend.cancel()
    runner.join(30)
    assert not runner.is_alive()
    (result,) = results
    assert result.outcome is not SandboxOutcome.TIMED_OUT and not result.ok
    _nothing_left(run, result, watch.seen)


def test_a_sandbox_starting_as_its_caller_stops_is_killed_at_once(run: Run) -> None:
    stop = threading.Event()
    stop.set()  # cancel() came while this sandbox was starting: it was not there to be killed
    result = run("sh", "-c", "sleep 1000 & wait", timeout_s=120, cancelled=stop)
    assert result.outcome is not SandboxOutcome.TIMED_OUT and not result.ok
    assert result.duration_s < 30
    _nothing_left(run, result, [])
    assert run("true").ok  # the backend itself is not stopped: the stop was that caller's
