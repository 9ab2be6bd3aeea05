"""Run one rollout of a harness on this machine, through the proxy.

    result = run_rollout(ClaudeCode(), "Write hello.txt", proxy_url, Path("rollouts"))

Registers the rollout with the proxy (which mints its key), gives the harness a private home and
workspace, runs it headless in its own process group under a deadline, stops everything it
started, and records the rollout's end (phase, exit code) with the proxy. Behind a proxy pool
(``openforge proxy --workers N``) the harness calls the worker that owns the rollout (the
registration answer's ``base_url``), never the pool's front. Every process of the
rollout carries ``OPENFORGE_SERVICE_ID``, so nothing it spawns can outlive it unnoticed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.harnesses.base import Endpoint, Harness, Invocation, Report, RolloutDirs
from infra.local.process import SERVICE_ID_ENV, kill_tagged, processes_of
from infra.proxy_client import ProxyAdmin
from schemas.enums import RolloutPhase
from schemas.errors import ServiceError


@dataclass
class RolloutResult:
    """How one rollout ended."""

    rollout_id: str
    harness: str
    exit_code: int | None  # None when it was killed at the deadline
    phase: RolloutPhase
    duration_s: float
    report: Report
    dirs: RolloutDirs
    stdout_path: Path
    stderr_path: Path
    service_id: str  # the tag its processes carried

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def leftovers(self) -> list[int]:
        """Processes of this rollout still alive (should be none)."""
        return processes_of(self.service_id)


def _stop_group(proc: subprocess.Popen[bytes], service_id: str, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    kill_tagged(service_id)


def run_invocation(
    inv: Invocation, service_id: str, stdout: Path, stderr: Path, timeout_s: float
) -> tuple[int | None, float]:
    """Run a prepared command to its end or its deadline; (exit code or None, seconds)."""
    env = {**inv.env, SERVICE_ID_ENV: service_id}
    start = time.monotonic()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        try:
            proc = subprocess.Popen(
                inv.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=inv.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {inv.argv[0]}: {exc}") from exc
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        except BaseException:
            _stop_group(proc, service_id, grace=2.0)
            raise
        # The harness has exited (or timed out): whatever it left running goes too.
        _stop_group(proc, service_id, grace=5.0)
    return code, time.monotonic() - start


def run_rollout(
    harness: Harness,
    task: str,
    proxy_url: str,
    root: Path,
    *,
    rollout_id: str | None = None,
    model: str = "tiny",
    timeout_s: float = 300.0,
    task_id: str | None = None,
    group_id: str | None = None,
    admin_token: str | None = None,
) -> RolloutResult:
    """Run ``task`` in ``harness`` against the proxy at ``proxy_url``; see the module doc."""
    rollout_id = rollout_id or f"{harness.name}-{uuid.uuid4().hex[:12]}"
    admin = ProxyAdmin(proxy_url, admin_token)
    registered = admin.register_rollout(
        rollout_id,
        task_id=task_id,
        group_id=group_id,
        harness=harness.name,
        harness_version=harness.version,
    )
    dirs = RolloutDirs.under(root / rollout_id)
    # Behind a proxy pool, straight to the worker that owns the rollout (no hop via the front).
    base = registered.base_url or proxy_url
    endpoint = Endpoint(base, rollout_id, registered.api_key or "none", model)
    inv = harness.invocation(task, endpoint, dirs, timeout_s)
    service_id = f"{os.getpid()}.rollout-{harness.name}.{uuid.uuid4().hex[:12]}"
    stdout, stderr = root / rollout_id / "stdout.log", root / rollout_id / "stderr.log"
    code: int | None = None
    phase, message = RolloutPhase.FAILED, "the harness did not start"
    elapsed = 0.0
    try:
        code, elapsed = run_invocation(inv, service_id, stdout, stderr, timeout_s)
        if code is None:
            phase, message = RolloutPhase.TIMED_OUT, f"killed after {timeout_s:.0f}s"
        else:
            phase = RolloutPhase.FINISHED if code == 0 else RolloutPhase.FAILED
            message = f"exit code {code}"
    finally:
        admin.finish_rollout(rollout_id, phase, exit_code=code, backend="local", message=message)
    report = harness.report(stdout.read_text(errors="replace"))
    return RolloutResult(
        rollout_id, harness.name, code, phase, elapsed, report, dirs, stdout, stderr, service_id
    )
