"""Several proxy worker processes on one host (``openforge proxy --workers N``).

Each worker (:mod:`proxy.worker`) is a whole proxy: it owns the rollouts registered on it (their
keys, continuity threads and delta state), publishes to the same event log (Kafka, or the local
log, which takes appends from several processes under a file lock) and spools to its own
``SPOOL/w<i>``. The pool binds every worker's sockets before it starts them (TCP
``worker_port_base + i``, or a free port; and ``<uds stem>-w<i><suffix>`` when a Unix socket
is served), starts the processes, and waits until each answers ``/health``. The front
(:mod:`proxy.front`) assigns rollouts to workers and fans the admin API out to all of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy.config import ProxyConfig
from proxy.serve import listeners
from proxy.worker import WorkerSpec
from schemas.errors import ConfigError, ServiceError

log = logging.getLogger("openforge.proxy")


@dataclass
class Worker:
    """A started worker: its index, the URL harnesses call, its Unix socket, its process."""

    index: int
    base_url: str
    unix_socket: Path | None
    process: subprocess.Popen[bytes]

    def exited(self) -> int | None:
        return self.process.poll()


def worker_socket(uds: Path, index: int) -> Path:
    return uds.with_name(f"{uds.stem}-w{index}{uds.suffix}")


def advertised_host(host: str) -> str:
    """The host name in the workers' base URLs (a wildcard bind advertises the host name)."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


class WorkerPool:
    """``n`` worker processes serving ``config``; a context manager (stops them on exit)."""

    def __init__(
        self,
        config: ProxyConfig,
        n: int,
        host: str = "127.0.0.1",
        unix_socket: Path | None = None,
        worker_port_base: int | None = None,
        ready_timeout: float = 180.0,
        log_dir: Path | None = None,
    ) -> None:
        if n < 1:
            raise ConfigError(f"--workers must be 1 or more, not {n}")
        self.config, self.n, self.host = config, n, host
        self.unix_socket, self.port_base = unix_socket, worker_port_base
        self.ready_timeout = ready_timeout
        self.log_dir = log_dir
        self.workers: list[Worker] = []

    def __enter__(self) -> WorkerPool:
        try:
            for i in range(self.n):
                self.workers.append(self._start(i))
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self, index: int) -> Worker:
        port = 0 if self.port_base is None else self.port_base + index
        uds = worker_socket(self.unix_socket, index) if self.unix_socket is not None else None
        sockets = listeners(self.host, port, uds)
        bound = int(sockets[0].getsockname()[1])
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
            for s in sockets:  # the worker holds its own copies now
                s.close()
            if log_file is not None:
                log_file.close()
        return Worker(index, f"http://{advertised_host(self.host)}:{bound}", uds, process)

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

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every worker (each flushes its publisher), SIGKILL after ``grace`` seconds."""
        for worker in self.workers:
            if worker.exited() is None:
                worker.process.terminate()
        deadline = time.monotonic() + grace
        for worker in self.workers:
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("proxy worker %d did not stop in %g s: killing it", worker.index, grace)
                worker.process.kill()
                worker.process.wait()
            if worker.unix_socket is not None:
                with contextlib.suppress(FileNotFoundError):
                    worker.unix_socket.unlink()
        self.workers = []
