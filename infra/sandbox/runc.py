"""The container sandbox: each run a fresh runc container of the task's own image (Debian's
``runc``; no Docker engine, no daemon).

Per run, under a state directory: a writable overlay layer over the image's root filesystem
(``spec.root``, shared read-only by every run of the image, so a container starts in tens of
milliseconds and the next run sees none of this one's writes), the OCI bundle
(:mod:`infra.sandbox.runc_spec`: namespaces, mounts, the image's user, limits), and runc's own
log. ``runc run --keep`` runs the command in the foreground with the spec's stdout and stderr;
its exit status is the command's. The cgroup runc made is read (OOM kills, forks refused at the
pids limit, peak memory) before ``runc delete`` removes it, then the overlay is unmounted and
the state removed: nothing is left behind. The network namespace holds only loopback; with a
proxy, the forwarder hook (:mod:`infra.sandbox.forwarder`, run on the host by runc before the
command starts) listens on ``127.0.0.1:PORT`` inside and relays to the proxy's host socket, which
the container never sees. At the deadline, or on :meth:`RuncSandbox.cancel`, ``runc kill --all``
kills every process of the container.

Needs root (runc's cgroup and overlay set-up), or, for a non-root user, the user namespace of
:mod:`infra.rootless` (the ``openforge`` commands that run containers enter it by themselves):
there runc runs the container as a rootless one, without a cgroup (a non-root user cannot make
one here), so the memory and process limits are rlimits (:func:`~infra.sandbox.runc_spec.rlimits`),
CPU is not capped, and the outcome cannot tell a limit from another failure. Elsewhere
:meth:`~RuncSandbox.preflight` raises SetupError saying why, and to use bubblewrap.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from functools import cached_property
from pathlib import Path

from infra import rootless
from infra.local.process import kill_tagged
from infra.sandbox import cgroups, mounts, runc_spec
from infra.sandbox.base import (
    SANDBOXES,
    SandboxBackend,
    SandboxName,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.collect import collect
from infra.sandbox.outcome import Counters, classify
from schemas.errors import ConfigError, SandboxError, SetupError

NOT_ROOT = (
    "the runc container sandbox needs root, or a user namespace of your subordinate ids "
    "(`openforge` enters one by itself where it can); {why}. Run tasks in the bubblewrap "
    "sandbox instead (--sandbox bubblewrap)"
)


def _counter(path: Path, key: str) -> int | None:
    try:
        return cgroups._read_counter(path, key)
    except OSError:
        return None


def _start_error(log: Path) -> str | None:
    """runc's own error (its log, not the command's stderr), if it failed to start the command."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("level") in ("error", "fatal"):
                return str(entry.get("msg", line))
    return None


def _started(pidfile: Path, asked: float) -> float | None:
    """Seconds from asking for the container to its command's start: runc writes the pid file
    once the container's process runs the command (None: it never did)."""
    try:
        return max(pidfile.stat().st_mtime - asked, 0.0)
    except OSError:
        return None


class RuncSandbox(SandboxBackend):
    """Runs each spec in a fresh runc container over ``spec.root``; see the module docstring."""

    name = SandboxName.RUNC

    def __init__(self, state: Path | None = None) -> None:
        # Per user: a rootless user's runc state is theirs, never root's.
        uid = rootless.host_uid()
        default = "openforge-runc" if uid == 0 else f"openforge-runc-{uid}"
        self.state = state or Path(tempfile.gettempdir()) / default
        self.rootless = rootless.inside()  # no cgroups: rlimits stand in
        self._running: set[str] = set()
        self._lock = threading.Lock()

    @cached_property
    def runc(self) -> str:
        found = shutil.which("runc")
        if found is None:
            raise SetupError(
                "runc is not installed: `apt-get install runc` (as root), or `scripts/setup images`"
            )
        return found

    def preflight(self) -> None:
        if os.geteuid() != 0:
            reason = rootless.unavailable() or "this process was not started in it"
            if os.environ.get(rootless.OPT_OUT) == "0":
                reason = f"{rootless.OPT_OUT}=0 is set"
            raise SetupError(NOT_ROOT.format(why=reason))
        self.runc  # noqa: B018 - raises SetupError when missing
        if not self.rootless and (why := cgroups.unavailable()) is not None:
            raise SetupError(f"the container sandbox needs cgroup v1 groups here: {why}")

    def _runc(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [self.runc, "--root", str(self.state / "runc"), *args], capture_output=True
        )

    def _kill(self, cid: str) -> None:
        """SIGKILL every process of the container: its first process, whose death takes its pid
        namespace (and so everything else in it) down, and, with a cgroup, every member."""
        self._runc("kill", cid, "KILL")
        if not self.rootless:  # --all finds the processes through the cgroup
            self._runc("kill", "--all", cid, "KILL")

    def set_cpu_shares(self, sandbox_id: str, shares: int) -> bool:
        if self.rootless:
            return False
        group = self._cgroup_path(sandbox_id.rsplit(".", 1)[-1]).lstrip("/")
        try:
            (cgroups.ROOT / "cpu" / group / "cpu.shares").write_text(str(shares))
        except OSError:
            return False
        return True

    def cancel(self) -> None:
        with self._lock:
            running = list(self._running)
        for cid in running:
            self._kill(cid)

    def run(self, spec: SandboxSpec) -> SandboxResult:
        if spec.root is None:
            raise ConfigError("the runc sandbox runs an image: give the spec its root (RootFs)")
        self.preflight()
        asked = time.time()
        cid = uuid.uuid4().hex[:16]
        sandbox_id = f"{os.getpid()}.sandbox.{cid}"
        for path in (spec.stdout, spec.stderr):
            path.parent.mkdir(parents=True, exist_ok=True)
        problem = self._cannot_start(spec)
        if problem is not None:
            spec.stdout.write_bytes(b"")
            spec.stderr.write_text(f"openforge-sandbox: {problem}\n")
            return SandboxResult(SandboxOutcome.FAILED_TO_START, None, 0.0, problem, sandbox_id)
        run_dir = self.state / "runs" / cid
        rootfs = run_dir / "rootfs"
        cgroup = None if self.rootless else self._cgroup_path(cid)
        stopped = False  # it ran and its first process exited: nothing of it runs any more
        try:
            self._mount_layer(spec, run_dir, rootfs)
            config = runc_spec.runtime_spec(
                spec, sandbox_id, rootfs, cgroup, run_dir / "forwarder.pid", self._memsw
            )
            (run_dir / "config.json").write_text(json.dumps(config))
            code, timed_out, duration = self._run_container(spec, cid, run_dir)
            started = _started(run_dir / "init.pid", asked)
            start_error = _start_error(run_dir / "runc.log") if code else None
            stopped = not timed_out and start_error is None
            # Nothing still writes while we copy: the first process has exited, and its pid
            # namespace, every other process of the container with it (or, at the deadline,
            # all were killed).
            counters = self._counters(cgroup)
            collect(spec, rootfs)
        finally:
            if not (stopped and self._remove_stopped(cid, cgroup)):
                self._runc("delete", "--force", cid)
            self._tear_down(run_dir, rootfs, sandbox_id, spec.proxy is not None)
        if start_error is not None:
            message = f"the container did not start: {start_error}"
            return SandboxResult(
                SandboxOutcome.FAILED_TO_START, code, duration, message, sandbox_id
            )
        return classify(
            spec, sandbox_id, code, timed_out, duration, counters, "container", start_s=started
        )

    @staticmethod
    def _cannot_start(spec: SandboxSpec) -> str | None:
        assert spec.root is not None
        if not (spec.root.path / "etc").is_dir():
            return f"the image's root filesystem {spec.root.path} is not there: build it again"
        for m in spec.mounts:
            if not m.host.exists():
                return f"mount source {m.host} (for {m.inside}) does not exist: create it first"
        if spec.proxy is not None and not spec.proxy.socket.exists():
            return f"no Unix socket at {spec.proxy.socket}: start the proxy listening on it first"
        return None

    @staticmethod
    def _mount_layer(spec: SandboxSpec, run_dir: Path, rootfs: Path) -> None:
        assert spec.root is not None
        upper, work = run_dir / "upper", run_dir / "work"
        for d in (upper, work, rootfs):
            d.mkdir(parents=True)
        mounts.mount_overlay(spec.root.path, upper, work, rootfs)

    @staticmethod
    def _cgroup_path(cid: str) -> str:
        own = cgroups._own_group("memory").relative_to(cgroups.ROOT / "memory")
        return "/" + str(own / "openforge" / cid).lstrip("/")

    @cached_property
    def _memsw(self) -> bool:
        return (cgroups._own_group("memory") / "memory.memsw.limit_in_bytes").exists()

    def _run_container(
        self, spec: SandboxSpec, cid: str, run_dir: Path
    ) -> tuple[int | None, bool, float]:
        """(exit code, timed out, seconds) of ``runc run`` in the foreground."""
        argv = [self.runc, "--root", str(self.state / "runc"), "--log", str(run_dir / "runc.log")]
        argv += ["--log-format", "json", "run", "--keep", "--bundle", str(run_dir)]
        argv += ["--pid-file", str(run_dir / "init.pid"), cid]  # written once its command runs
        start = time.monotonic()
        with open(spec.stdout, "wb") as out, contextlib.ExitStack() as stack:
            err = (
                out if spec.stderr == spec.stdout else stack.enter_context(open(spec.stderr, "wb"))
            )
            with self._lock:
                self._running.add(cid)
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
                )
            except OSError as exc:
                raise SandboxError(f"cannot start runc: {exc}") from exc
            try:
                code, timed_out = self._wait(proc, cid, start + spec.timeout_s, spec.cancelled)
            finally:
                with self._lock:
                    self._running.discard(cid)
                if proc.poll() is None:  # interrupted: take the container down with us
                    self._kill(cid)
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        return code, timed_out, time.monotonic() - start

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        cid: str,
        deadline: float,
        cancelled: threading.Event | None,
    ) -> tuple[int | None, bool]:
        """(exit code, timed out) of ``runc run``: killed at the deadline, and again every
        half second once the caller's ``cancelled`` is set (a container still being created
        when it was set is not there yet for the first kill)."""
        step = 0.5 if cancelled is not None else float("inf")  # no stop to look for: one wait
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(step, deadline - time.monotonic()))), False
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self._kill(cid)
                    proc.wait()
                    return None, True
                if cancelled is not None and cancelled.is_set():
                    self._kill(cid)

    @staticmethod
    def _counters(cgroup: str | None) -> Counters:
        if cgroup is None:  # rootless: no cgroup tells what struck or what it used
            return Counters()
        memory = cgroups.ROOT / "memory" / cgroup.lstrip("/")
        pids = cgroups.ROOT / "pids" / cgroup.lstrip("/")
        peak: float | None = None
        with contextlib.suppress(OSError, ValueError):
            peak = int((memory / "memory.max_usage_in_bytes").read_text()) / 2**20
        return Counters(
            _counter(memory / "memory.oom_control", "oom_kill"),
            _counter(pids / "pids.events", "max"),
            peak,
            cgroups.cpu_seconds(cgroups.ROOT / "cpuacct" / cgroup.lstrip("/")),
        )

    def _remove_stopped(self, cid: str, cgroup: str | None) -> bool:
        """What ``runc delete`` does for a container with no process left, without another
        runc process (about 25 ms a run at concurrency 8): remove its now empty cgroup in
        every hierarchy and runc's state directory. False when a group was not empty (then
        ``runc delete --force`` takes over)."""
        if cgroup is not None:
            for hierarchy in cgroups.ROOT.iterdir():
                try:
                    (hierarchy / cgroup.lstrip("/")).rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    return False
        shutil.rmtree(self.state / "runc" / cid, ignore_errors=True)
        return True

    def _tear_down(self, run_dir: Path, rootfs: Path, sandbox_id: str, forwarder: bool) -> None:
        if forwarder:
            try:
                os.kill(int((run_dir / "forwarder.pid").read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass  # it had already gone with the container
            except (OSError, ValueError):
                kill_tagged(sandbox_id)  # it had not written its pid: find it by its tag
        if os.path.ismount(rootfs):
            mounts.unmount(rootfs)
        shutil.rmtree(run_dir, ignore_errors=True)
        if run_dir.exists():
            raise SandboxError(f"cannot remove the run's state {run_dir}: remove it by hand")


SANDBOXES.add(SandboxName.RUNC, RuncSandbox)
