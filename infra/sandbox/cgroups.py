"""Per-sandbox cgroup v1 groups (``memory`` and ``pids``, and ``cpuacct`` where it is mounted for
the CPU time used): limits, counters, and kill-everything.

Each sandbox gets one child group per controller, created *under the caller's own group* (read
from ``/proc/self/cgroup``), so the sandbox stays inside whatever limits the caller already has.
A process joins both groups before it execs bwrap, and every descendant inherits them: no process
of the sandbox can leave (the sandbox has no ``/sys`` and no capabilities).

Guarantees: memory (RSS, page cache and tmpfs pages, and swap where ``memsw`` exists) of the
whole sandbox is capped at the limit, over which the kernel's OOM killer kills inside the group;
the number of tasks is capped at ``pids.max``; after :meth:`SandboxCgroup.kill_all` returns, the
groups hold no process. cgroup v2 (unified) hierarchies are not handled here: :func:`unavailable`
says why and the backend falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from functools import cache
from pathlib import Path

from schemas.errors import SandboxError

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")


def _own_group(controller: str) -> Path:
    """The directory of this process's group in ``controller``'s v1 hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return ROOT / controller / path.lstrip("/")
    raise FileNotFoundError(f"no cgroup v1 {controller} hierarchy in /proc/self/cgroup")


def _read_counter(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


class SandboxCgroup:
    """The ``memory`` and ``pids`` groups of one sandbox, named ``openforge-sandbox-<name>``."""

    def __init__(self, name: str, memory_bytes: int, max_tasks: int) -> None:
        self.dirs = [_own_group(c) / f"openforge-sandbox-{name}" for c in CONTROLLERS]
        self._memory, self._pids = self.dirs
        self._cpu: Path | None = None  # CPU accounting, where the hierarchy is mounted
        with contextlib.suppress(FileNotFoundError):
            self._cpu = _own_group("cpuacct") / f"openforge-sandbox-{name}"
            self.dirs.append(self._cpu)
        try:
            for d in self.dirs:
                d.mkdir()
            (self._memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            memsw = self._memory / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # no swapping past the limit either
                memsw.write_text(str(memory_bytes))
            (self._pids / "pids.max").write_text(str(max_tasks))
        except OSError as exc:
            self.remove()
            raise SandboxError(f"cannot set up the sandbox's cgroups {self.dirs}: {exc}") from exc

    @property
    def procs_files(self) -> list[Path]:
        """The files a process writes its pid to, to join the groups."""
        return [d / "cgroup.procs" for d in self.dirs]

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in this group (``memory.oom_control``'s ``oom_kill``)."""
        return _read_counter(self._memory / "memory.oom_control", "oom_kill")

    def fork_failures(self) -> int:
        """Forks refused at ``pids.max`` (``pids.events``'s ``max``)."""
        return _read_counter(self._pids / "pids.events", "max")

    def cpu_s(self) -> float | None:
        """CPU time of every process that was in the group (None: no ``cpuacct`` here)."""
        return None if self._cpu is None else cpu_seconds(self._cpu)

    def peak_memory_mib(self) -> float:
        return int((self._memory / "memory.max_usage_in_bytes").read_text()) / 2**20

    def pids(self) -> set[int]:
        out: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                out.update(int(p) for p in procs.read_text().split())
        return out

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the groups until they are empty, or raise SandboxError."""
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"processes {sorted(pids)} in {self.dirs} survived SIGKILL for {timeout:.0f}s "
                    "(stuck in uninterruptible I/O?); kill them by hand and remove the groups"
                )
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Remove the (empty) groups; a group that is still busy is retried briefly."""
        for d in self.dirs:
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last task is being reaped
                    time.sleep(0.005)


def cpu_seconds(group: Path) -> float | None:
    """The CPU time a ``cpuacct`` group counted (its ``cpuacct.usage``, in ns); None if absent."""
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


@cache
def unavailable() -> str | None:
    """Why per-sandbox cgroup v1 groups cannot be used here (None when they can); checked once."""
    try:
        probe = SandboxCgroup(f"probe-{os.getpid()}", 64 * 2**20, 64)
    except (OSError, SandboxError) as exc:
        return str(exc)
    probe.remove()
    return None
