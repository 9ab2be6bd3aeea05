"""What every sandbox backend with a cgroup counts of a run, checked the same way for each."""

from __future__ import annotations

from collections.abc import Callable

from infra.sandbox import SandboxResult


def check_usage_is_counted(run: Callable[..., SandboxResult], err: Callable[[], str]) -> None:
    """A busy run and an idle one: CPU time, peak memory and the sandbox's start counted."""
    busy = run("python3", "-c", "b = bytearray(64 * 2**20); sum(range(4 * 10**6))")
    idle = run("sleep", "0.3")
    assert busy.ok and idle.ok, (busy, err())
    assert busy.cpu_s is not None and busy.cpu_s > 0.05  # the sum's loop, in the sandbox
    assert idle.cpu_s is not None and idle.cpu_s < busy.cpu_s / 2  # sleeping costs nothing
    assert busy.peak_memory_mib is not None and busy.peak_memory_mib >= 64
    # Its start, before the command ran: a fraction of the run (the sleep alone is 0.3 s).
    assert idle.start_s is not None and 0 < idle.start_s < idle.duration_s - 0.25
