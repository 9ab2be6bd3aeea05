"""A supervised local service process: started with a log file, probed until ready, stopped cleanly.

Each service runs in its own process group and carries ``OPENFORGE_SERVICE_ID`` in its
environment, which every descendant inherits; :func:`leftover_processes` finds any process still
carrying one, so a test suite can check that it left nothing behind.
"""

from __future__ import annotations

import abc
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from schemas.errors import ServiceError

SERVICE_ID_ENV = "OPENFORGE_SERVICE_ID"


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


NODE_PORTS = 30_000  # Kubernetes' NodePort range starts here (30000-32767)


def _service_ports() -> range:
    """Ports below the kernel's ephemeral range: an outgoing connection (any process's) takes
    its local port from that range, so a port picked there can be taken before the service
    that was given it binds it (kube-proxy's health port was, in CI: "address already in use").
    And below Kubernetes' NodePort range: the real node's policy agent lets pods reach the
    node's ports in it, so a kubelet given one was reachable from a rollout's pod."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10_000, max(min(low, NODE_PORTS), 10_001))


def free_port() -> int:
    """An unused TCP port on the loopback interface, below the ephemeral range (see
    :func:`_service_ports`); the kernel's pick if none of a few random tries binds."""
    ports = _service_ports()
    for _ in range(64):
        port = random.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthz(port: int) -> bool:
    """Whether ``http://127.0.0.1:PORT/healthz`` answers 200 (a Kubernetes component's)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
        return bool(resp.status == 200)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    try:
        data = path.read_bytes()[-64_000:]
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class ServiceProcess:
    """One service process. Use :meth:`start`, :meth:`wait_ready` and :meth:`stop`."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else dict(os.environ)
        self.cwd = cwd
        # "<owner pid>.<name>.<random>": the owner is the process that started the service.
        self.service_id = f"{os.getpid()}.{name}.{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(self.env)
        env[SERVICE_ID_ENV] = self.service_id
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%F %T')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServiceError(f"{self.name}: cannot start {self.argv[0]}: {exc}") from exc

    def poll(self) -> int | None:
        """The exit code if the process has exited, else None."""
        return self._proc.poll() if self._proc else None

    def check_alive(self) -> None:
        """Raise :class:`ServiceError` with the log's tail if the process has exited."""
        code = self.poll()
        if code is not None:
            raise ServiceError(
                f"{self.name} exited with code {code}. Last lines of {self.log_path}:\n"
                f"{tail(self.log_path)}"
            )

    def wait_ready(self, probe: Callable[[], bool], timeout: float, interval: float = 0.25) -> None:
        """Poll ``probe`` until it returns True; fail fast if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(Exception):
                if probe():
                    return
            time.sleep(interval)
        self.stop()
        raise ServiceError(
            f"{self.name} was not ready after {timeout:.0f}s. Last lines of {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self._proc.wait(timeout=10)
        # Descendants that left the group (daemons) still carry our service id.
        kill_tagged(self.service_id)
        self._proc = None


def _tagged_pids(prefix: str) -> list[int]:
    needle = f"{SERVICE_ID_ENV}={prefix}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(needle) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def kill_tagged(service_id: str, timeout: float = 10.0) -> None:
    """SIGKILL every process still carrying ``service_id`` and wait for them to go."""
    for pid in _tagged_pids(service_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while _tagged_pids(service_id) and time.monotonic() < deadline:
        time.sleep(0.1)


def processes_of(service_id: str) -> list[int]:
    """Pids of the processes (the service and its descendants) carrying ``service_id``."""
    return _tagged_pids(service_id)


def leftover_processes(owner: int | None = None) -> list[int]:
    """Pids of live (non-zombie) service processes started by process ``owner`` (default: us)."""
    alive = []
    for pid in _tagged_pids(f"{owner if owner is not None else os.getpid()}."):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


class LocalService(abc.ABC):
    """A local service with ``start``/``stop``, usable as a context manager."""

    description = "service"
    _process: ServiceProcess | None = None

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def check_alive(self) -> None:
        """Raise :class:`ServiceError` (with the log's tail) unless the service is running."""
        if self._process is None:
            raise ServiceError(f"the {self.description} is not running")
        self._process.check_alive()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
