"""How a sandboxed command ended, from what every backend measures (exit code, the deadline,
the limits' counters): one classification for bubblewrap and runc alike."""

from __future__ import annotations

from dataclasses import dataclass

from infra.sandbox.base import SandboxOutcome, SandboxResult, SandboxSpec


@dataclass(frozen=True)
class Counters:
    """What a sandbox's cgroup counted over its run (None: no cgroup, or the backend cannot
    tell): OOM kills, forks refused at the process limit, peak memory, CPU time."""

    oom_kills: int | None = None
    fork_failures: int | None = None
    peak_memory_mib: float | None = None
    cpu_s: float | None = None


def classify(
    spec: SandboxSpec,
    sandbox_id: str,
    code: int | None,
    timed_out: bool,
    duration: float,
    counters: Counters,
    what: str = "sandbox",
    start_error: str | None = None,
    start_s: float | None = None,
) -> SandboxResult:
    """The result: timed out, failed to start (``start_error``, the backend's own complaint),
    out of memory or of processes (a limit struck and the command did not exit 0), or exited;
    the message names the limits that struck."""
    ooms, forks = counters.oom_kills, counters.fork_failures
    notes = []
    if ooms:
        notes.append(f"the OOM killer killed {ooms} process(es) at {spec.limits.memory_mib} MiB")
    if forks:
        notes.append(f"{forks} fork(s) failed at {spec.limits.max_processes} processes")
    note = f" ({'; '.join(notes)})" if notes else ""

    def result(outcome: SandboxOutcome, message: str) -> SandboxResult:
        return SandboxResult(
            outcome,
            code,
            duration,
            message + note,
            sandbox_id,
            ooms,
            forks,
            counters.peak_memory_mib,
            cpu_s=counters.cpu_s,
            start_s=start_s,
        )

    if timed_out:
        return result(
            SandboxOutcome.TIMED_OUT,
            f"timed out after {spec.timeout_s:g}s; every process of the {what} was killed",
        )
    assert code is not None
    if start_error is not None:
        return result(SandboxOutcome.FAILED_TO_START, f"the {what} did not start: {start_error}")
    if ooms and code != 0:
        return result(SandboxOutcome.OUT_OF_MEMORY, f"exited with {code} at the memory limit")
    if forks and code != 0:
        return result(SandboxOutcome.TOO_MANY_PROCESSES, f"exited with {code} at the process limit")
    return result(SandboxOutcome.EXITED, f"exited with {code}")
