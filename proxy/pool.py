"""Several proxy worker processes on one host (``openforge proxy --workers N``).

Each worker (:mod:`proxy.worker`) is a whole proxy: it owns the rollouts registered on it (their
keys, continuity threads and delta state), publishes to the same event log (Kafka, or the local
log, which takes appends from several processes under a file lock) and spools to its own
``SPOOL/w<i>``. The pool binds every worker's sockets before it starts them (TCP
``worker_port_base + i``, or a free port; and ``<uds stem>-w<i><suffix>`` when a Unix socket
is served), starts the processes, and waits until each answers ``/health``. The front
(:mod:`proxy.front`) assigns rollouts to workers and fans the admin API out to all of them.

Restarts: the pool keeps its own copy of every worker's listening sockets for as long as it
runs, and a supervisor thread restarts a worker that exits (with a warning naming its status)
on those same sockets, after a back-off that grows while it keeps dying (1 s, 2 s, ... 30 s).
So a rollout's ``base_url`` and Unix socket stay valid across a restart: the port is never
released (connections made meanwhile wait in the listen backlog) and the socket file is never
replaced (a sandbox bind-mounts the file itself, so a new file would not reach it). What a
restart cannot bring back is the dead worker's per-rollout state: its rollouts' keys,
continuity and calls in flight. Their calls and their finish are then refused (401 / 404), which
the orchestrator treats as an infrastructure failure and retries as a new rollout; its records
were durable before each call was answered, and its spool is replayed by the new process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from proxy.config import ProxyConfig
from proxy.serve import listeners
from proxy.worker import WorkerSpec
from schemas.errors import ConfigError, ServiceError

log = logging.getLogger("openforge.proxy")

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # a worker that keeps dying waits longer
STABLE_S = 60.0  # a worker that ran this long before it died restarts at once


@dataclass
class Worker:
    """A started worker: its index, the URL harnesses call, its Unix socket, its process (a new
    one after each restart) and how often it was restarted."""

    index: int
    base_url: str
    unix_socket: Path | None
    process: subprocess.Popen[bytes]
    sockets: list[socket.socket] = field(default_factory=list, repr=False)  # the pool's copies
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def exited(self) -> int | None:
        return self.process.poll()


def worker_socket(uds: Path, index: int) -> Path:
    return uds.with_name(f"{uds.stem}-w{index}{uds.suffix}")


def advertised_host(host: str) -> str:
    """The host name in the workers' base URLs (a wildcard bind advertises the host name)."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


class WorkerPool:
    """``n`` worker processes serving ``config``; a context manager (stops them on exit).

    ``advertise_host`` is the host name in the workers' base URLs (default: ``host``, or this
    machine's name for a wildcard bind), e.g. the Service name rollout pods reach the pool by.
    """

    def __init__(
        self,
        config: ProxyConfig,
        n: int,
        host: str = "127.0.0.1",
        unix_socket: Path | None = None,
        worker_port_base: int | None = None,
        ready_timeout: float = 180.0,
        log_dir: Path | None = None,
        advertise_host: str | None = None,
        supervise_every_s: float = 0.5,
    ) -> None:
        if n < 1:
            raise ConfigError(f"--workers must be 1 or more, not {n}")
        if n > 1 and config.session_client_header is not None:
            raise ConfigError(
                "--session-client-header needs --workers 1: the front sends each session to the "
                "worker of its identity, so one client's sessions are on several workers and "
                "none sees them all"
            )
        self.config, self.n, self.host = config, n, host
        self.unix_socket, self.port_base = unix_socket, worker_port_base
        self.ready_timeout = ready_timeout
        self.log_dir = log_dir
        self.advertise_host = advertise_host or advertised_host(host)
        self.workers: list[Worker] = []
        self._every = supervise_every_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart and stop() never overlap
        self._supervisor: threading.Thread | None = None

    def __enter__(self) -> WorkerPool:
        try:
            for i in range(self.n):
                self.workers.append(self._bind_and_start(i))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._supervisor = threading.Thread(
            target=self._supervise, name="proxy-pool-supervisor", daemon=True
        )
        self._supervisor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind_and_start(self, index: int) -> Worker:
        port = 0 if self.port_base is None else self.port_base + index
        uds = worker_socket(self.unix_socket, index) if self.unix_socket is not None else None
        sockets = listeners(self.host, port, uds)
        bound = int(sockets[0].getsockname()[1])
        try:
            process = self._spawn(index, sockets)
        except BaseException:
            for s in sockets:
                s.close()
            raise
        return Worker(index, f"http://{self.advertise_host}:{bound}", uds, process, sockets)

    def _spawn(self, index: int, sockets: list[socket.socket]) -> subprocess.Popen[bytes]:
        config = dataclasses.replace(self.config, spool_dir=self.config.spool_dir / f"w{index}")
        fds = tuple(s.fileno() for s in sockets)
        log_file = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = open(self.log_dir / f"proxy-w{index}.log", "ab")  # noqa: SIM115
        try:  # without a log dir the worker writes to this process's stdout and stderr
            process = subprocess.Popen(
                [sys.executable, "-m", "proxy.worker"],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.STDOUT if log_file is not None else None,
                pass_fds=fds,
            )
            assert process.stdin is not None
            process.stdin.write(pickle.dumps(WorkerSpec.of(index, config, fds)))
            process.stdin.close()
        finally:
            if log_file is not None:
                log_file.close()
        return process

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        pending = list(self.workers)
        while pending:
            for worker in list(pending):
                code = worker.exited()
                if code is not None:
                    raise ServiceError(
                        f"proxy worker {worker.index} exited with status {code} while starting"
                        f"{self._log_hint(worker.index)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{worker.base_url}/health", timeout=2).status_code < 500:
                        pending.remove(worker)
            if pending and time.monotonic() > deadline:
                raise ServiceError(
                    f"proxy workers {[w.index for w in pending]} did not answer /health within "
                    f"{self.ready_timeout:g} s{self._log_hint(pending[0].index)}"
                )
            time.sleep(0.1)

    def _log_hint(self, index: int) -> str:
        if self.log_dir is None:
            return ": see its output above"
        return f": see {self.log_dir / f'proxy-w{index}.log'}"

    def _supervise(self) -> None:
        """Restart each worker that exits, on its own sockets, until :meth:`stop`."""
        dead_since: dict[int, float] = {}
        while not self._stopping.wait(self._every):
            for worker in self.workers:
                code = worker.exited()
                if code is None:
                    continue
                now = time.monotonic()
                if worker.index not in dead_since:
                    dead_since[worker.index] = now
                    log.warning(
                        "proxy worker %d (%s) exited with status %s%s; restarting it on the same "
                        "port and socket (its rollouts' keys, continuity and calls in flight are "
                        "lost)",
                        worker.index, worker.base_url, code, self._log_hint(worker.index),
                    )  # fmt: skip
                if now - dead_since[worker.index] < self._backoff(worker, now):
                    continue
                with self._lock:
                    if self._stopping.is_set():
                        return
                    try:
                        worker.process = self._spawn(worker.index, worker.sockets)
                    except OSError as exc:  # try again after the next back-off
                        log.error("proxy worker %d could not be restarted: %s", worker.index, exc)
                        dead_since[worker.index] = now
                        continue
                    worker.restarts += 1
                    dead_since.pop(worker.index)
                    log.warning(
                        "proxy worker %d restarted (restart %d, pid %d)",
                        worker.index, worker.restarts, worker.process.pid,
                    )  # fmt: skip
                    worker.started_at = now

    @staticmethod
    def _backoff(worker: Worker, now: float) -> float:
        if now - worker.started_at >= STABLE_S:
            return 0.0
        return RESTART_BACKOFF_S[min(worker.restarts, len(RESTART_BACKOFF_S) - 1)]

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every worker (each flushes its publisher), SIGKILL after ``grace`` seconds;
        then close the pool's sockets and remove the Unix socket files."""
        self._stopping.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=5)
        with self._lock:
            for worker in self.workers:
                if worker.exited() is None:
                    worker.process.terminate()
            deadline = time.monotonic() + grace
            for worker in self.workers:
                try:
                    worker.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning(
                        "proxy worker %d did not stop in %g s: killing it", worker.index, grace
                    )
                    worker.process.kill()
                    worker.process.wait()
                for s in worker.sockets:
                    s.close()
                if worker.unix_socket is not None:
                    with contextlib.suppress(FileNotFoundError):
                        worker.unix_socket.unlink()
            self.workers = []
