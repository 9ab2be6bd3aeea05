"""The rollout sandbox boundary: run one command in a fresh, isolated sandbox and say how it ended.

An orchestrator calls :meth:`SandboxBackend.run` twice per rollout: once for the harness (the
agent, with the proxy reachable and the workspace writable) and once, in a fresh sandbox over the
same workspace, for the task's verifier (the tests mounted read-only). Every run starts from
nothing but its :class:`SandboxSpec`: no host environment variable, no host file outside the
system directories and the spec's mounts, no network but the proxy endpoint.

Contract of every backend:

- ``run`` blocks until the command and every process it started are gone. After it returns,
  nothing started inside the sandbox is running (background daemons included).
- ``run`` never raises for something the command did (exit code, signal, limit, timeout, a
  missing binary): that is a :class:`SandboxResult`. It raises :class:`~schemas.errors.ConfigError`
  for an invalid spec, :class:`~schemas.errors.SetupError` when the backend's tool is not
  installed or cannot work on this host, :class:`~schemas.errors.SandboxError` when it could not
  clean up.
- ``run`` is synchronous; run rollouts concurrently with threads (``asyncio.to_thread``): each call
  uses only its own state.
- :meth:`~SandboxBackend.preflight` raises the SetupError that ``run`` would raise for a missing
  or unusable tool, without running anything of a rollout.
"""

from __future__ import annotations

import abc
import posixpath
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from schemas.errors import ConfigError
from schemas.registry import Registry


class SandboxName(StrEnum):
    """The sandbox backends, by registry name."""

    BUBBLEWRAP = "bubblewrap"  # one machine, no Docker: bwrap namespaces + cgroup v1 limits
    RUNC = "runc"  # one machine, no Docker: a container of the task's own image (OCI, runc)


class SandboxOutcome(StrEnum):
    """How a sandboxed command ended."""

    EXITED = "exited"  # it exited on its own (any exit code), no limit was its undoing
    TIMED_OUT = "timed_out"  # the deadline passed; everything in the sandbox was killed
    OUT_OF_MEMORY = "out_of_memory"  # the memory limit's OOM killer struck and it did not exit 0
    TOO_MANY_PROCESSES = "too_many_processes"  # a fork failed at the process limit, exit != 0
    FAILED_TO_START = "failed_to_start"  # the command (or the sandbox around it) never ran


_RESERVED = ("/proc", "/dev", "/run/openforge")


def _inside_path(path: str, what: str) -> str:
    if not posixpath.isabs(path) or posixpath.normpath(path) != path.rstrip("/") or path == "/":
        raise ConfigError(
            f"{what} {path!r} must be a normalised absolute path inside the sandbox, "
            "other than '/', e.g. '/app'"
        )
    if any(path == r or path.startswith(r + "/") for r in _RESERVED):
        raise ConfigError(
            f"{what} {path!r} lies under {', '.join(_RESERVED)}, which the sandbox owns"
        )
    return path


@dataclass(frozen=True)
class Mount:
    """``host`` (a directory or file) appears at ``inside``; writable unless ``read_only``."""

    host: Path
    inside: str
    read_only: bool = True

    def __post_init__(self) -> None:
        _inside_path(self.inside, "mount point")


@dataclass(frozen=True)
class ProxyEndpoint:
    """The one way out: inside the sandbox, ``http://127.0.0.1:{port}`` reaches the HTTP server
    listening on the host Unix socket ``socket`` (the capture proxy). The socket must exist when
    the run starts and stay the same file for the run (it is bind-mounted, not looked up again).
    """

    socket: Path
    port: int

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"proxy port {self.port} is not a TCP port: use 1..65535, e.g. 8000")

    @property
    def base_url(self) -> str:
        """The URL a harness inside the sandbox uses for the proxy."""
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Limits:
    """Resource limits for everything in one sandbox together.

    ``max_processes`` counts tasks (processes and threads, as the kernel's pids controller does),
    including the sandbox's own two or three helper processes; size it for a Node.js harness
    (a dozen threads) plus the tools it runs.
    """

    memory_mib: int = 4096
    max_processes: int = 512
    cpus: float | None = None  # CPU time as a number of cores (a CFS quota); None: no cap
    # Relative CPU weight against other sandboxes under contention (cgroup v1 cpu.shares;
    # None: the default, 1024); a backend without a CPU group per sandbox ignores it.
    cpu_shares: int | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and not self.cpus > 0:
            raise ConfigError(f"cpus={self.cpus} must be positive, e.g. 1 or 0.5")
        if self.cpu_shares is not None and not 2 <= self.cpu_shares <= 262144:
            raise ConfigError(f"cpu_shares={self.cpu_shares}: use 2..262144 (1024: the default)")
        if self.memory_mib < 16 or self.max_processes < 8:
            raise ConfigError(
                f"limits too small to start anything (memory_mib={self.memory_mib}, "
                f"max_processes={self.max_processes}): use at least 16 MiB and 8 processes"
            )


@dataclass(frozen=True)
class RootFs:
    """An image's root filesystem (a host directory, never written: each run writes to its own
    layer above it) and the user its processes run as."""

    path: Path
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class SandboxSpec:
    """One command to run in a fresh sandbox.

    ``env`` is the command's whole environment (nothing is inherited from the host); the backend
    adds ``HOME``, ``TMPDIR`` and a default ``PATH`` unless given, and its own tag
    (``OPENFORGE_SERVICE_ID``). ``cwd`` is a path inside the sandbox, usually a mount point.
    ``home`` is a private, empty, writable directory (a mount at the same path replaces it).
    ``stdout``/``stderr`` are host files, truncated at start (they may be the same file).
    ``root`` is the image the command runs in (a backend that runs on the host's own system
    directories, such as bubblewrap, refuses a spec with one). ``collect`` names paths copied
    out of the sandbox once the command has ended (:mod:`infra.sandbox.collect`).
    """

    argv: tuple[str, ...]
    stdout: Path
    stderr: Path
    cwd: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    proxy: ProxyEndpoint | None = None
    limits: Limits = field(default_factory=Limits)
    timeout_s: float = 600.0
    home: str = "/home/agent"
    root: RootFs | None = None
    # (inside path, host destination, exclude patterns): copied out after the command ended
    collect: tuple[tuple[str, Path, tuple[str, ...]], ...] = ()
    # The caller's stop signal: once set, the sandbox is killed, also one that was still
    # starting when it was set (which the backend's cancel() alone could miss).
    cancelled: threading.Event | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.argv or not self.argv[0]:
            raise ConfigError("argv is empty: give the command to run, e.g. ('pytest', '-q')")
        if self.cwd != "/":
            _inside_path(self.cwd, "cwd")
        _inside_path(self.home, "home")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be positive, e.g. 600")
        seen = [m.inside for m in self.mounts]
        if len(set(seen)) != len(seen):
            raise ConfigError(f"two mounts share one mount point: {sorted(seen)}")


@dataclass(frozen=True)
class SandboxResult:
    """How one run ended. ``exit_code`` is the command's (128 + N when a signal N killed it), or
    None when it timed out or never started. ``sandbox_id`` names the run in logs and in
    ``infra.local.process.processes_of``. ``oom_kills`` and ``fork_failures`` count the times
    a limit struck during the run, whatever the outcome (None when the backend cannot tell);
    ``peak_memory_mib`` and ``cpu_s`` what the run used (None likewise).
    ``namespaces`` holds the inode numbers of the namespaces the command ran in (compare with
    ``/proc/self/ns/*`` on the host), where the backend reports them.
    """

    outcome: SandboxOutcome
    exit_code: int | None
    duration_s: float
    message: str
    sandbox_id: str = ""  # the OPENFORGE_SERVICE_ID tag its processes carried
    oom_kills: int | None = None
    fork_failures: int | None = None
    peak_memory_mib: float | None = None
    namespaces: Mapping[str, int] = field(default_factory=dict)  # e.g. {"pid": 4026532182}
    cpu_s: float | None = None  # CPU time of everything in the sandbox (None: no cgroup)
    start_s: float | None = None  # from asking for the sandbox to its command's start

    @property
    def ok(self) -> bool:
        """The command ran and exited 0."""
        return self.outcome is SandboxOutcome.EXITED and self.exit_code == 0


class SandboxBackend(abc.ABC):
    """Runs one :class:`SandboxSpec` at a time per call; see the module docstring's contract."""

    name: ClassVar[str]

    @abc.abstractmethod
    def run(self, spec: SandboxSpec) -> SandboxResult:
        """Run ``spec`` to completion (or its deadline) and return how it ended."""

    @abc.abstractmethod
    def preflight(self) -> None:
        """Raise SetupError (saying how to install or enable it) if :meth:`run` cannot work
        here; nothing otherwise."""

    def set_cpu_shares(self, sandbox_id: str, shares: int) -> bool:
        """Change a running sandbox's :attr:`Limits.cpu_shares` (``sandbox_id``: the tag its
        processes carry); False where this backend has no CPU group per sandbox."""
        return False

    @abc.abstractmethod
    def cancel(self) -> None:
        """Kill every sandbox this backend is running now (from any thread); their :meth:`run`
        calls then return as usual, with the command killed."""


SANDBOXES: Registry[type[SandboxBackend]] = Registry("sandbox backend")
