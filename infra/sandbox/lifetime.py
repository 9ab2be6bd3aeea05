"""Waiting for, and killing, the processes of one bubblewrap sandbox, without polling.

bwrap runs as the caller's child (the monitor); it forks the sandbox's init (pid 1 of the new
pid namespace), whose host pid it reports on ``--json-status-fd``. Both are waited for through
pidfds, so a run ends the moment its command does, and a reused pid cannot pass for the init.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time

from schemas.errors import SandboxError


class Init:
    """The sandbox's init (bwrap's pid 1), held by a pidfd so that a reused pid cannot pass for
    it. Once it has exited, so has everything else in its pid namespace (the kernel kills and
    reaps them first); it may stay a zombie until the machine's init reaps it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        with contextlib.suppress(ProcessLookupError):  # gone already: nothing to wait for
            self.fd = os.pidfd_open(pid)

    def kill(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)

    def wait_dead(self, timeout: float = 10.0) -> None:
        if self.fd is None:
            return
        try:
            if not select.select([self.fd], [], [], timeout)[0]:
                raise SandboxError(
                    f"the sandbox's init (pid {self.pid}) outlived its run by {timeout:.0f}s; "
                    "kill it by hand"
                )
        finally:
            os.close(self.fd)
            self.fd = None


def exits_within(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for ``proc`` to exit, at most ``timeout`` s; woken at once by a pidfd (Popen.wait
    with a timeout polls with sleeps of up to 50 ms)."""
    fd = os.pidfd_open(proc.pid)
    try:
        return bool(select.select([fd], [], [], max(0.0, timeout))[0])
    finally:
        os.close(fd)


def read_status(fd: int, deadline: float) -> dict[str, int]:
    """bwrap's first --json-status-fd document ({"child-pid": ..., "pid-namespace": ...}), or {}
    if bwrap ended (or the deadline passed) before it wrote one."""
    buf = b""
    while b"\n" not in buf:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return {}
        buf += chunk
    doc = json.loads(buf.split(b"\n", 1)[0])
    return {str(k): int(v) for k, v in doc.items()}
