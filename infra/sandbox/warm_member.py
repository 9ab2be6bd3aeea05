"""One warm sandbox: started ahead of a rollout with its harness's runtime loaded, it serves
exactly one rollout (:class:`Member`), then it is gone.

A member is a sandbox run of its own (:meth:`SandboxBackend.run`, in a thread) whose command is
:mod:`infra.sandbox.warm_main`: it preloads the harness's modules, writes ``ready`` and waits on
a FIFO in its home. Its rollout-private directories (home, workspace, logs) are its own, under
the member's directory, mounted where the rollout's would be (the home at its own path, the
same inside as on the host). :meth:`Member.run` then:

1. moves the rollout's laid-out files into the member's directories (a rename per entry, same
   owners), checking first that the spec is the member's :class:`Shape`;
2. writes the claim (argv, env, cwd) into the FIFO: the command starts in the sandbox that was
   already running, and the deadline counts from here;
3. waits for the sandbox's end, the rollout's deadline (every process of the sandbox killed:
   ``timed_out``) or the caller's ``cancelled``;
4. moves everything back where the rollout's spec named it (its directories, stdout, stderr, and
   the member's home into ``home_to``) and removes the member's directory.

Nothing is shared between rollouts: a member is one fresh sandbox of the backend, used once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from infra.sandbox.base import (
    Limits,
    Mount,
    ProxyEndpoint,
    RootFs,
    SandboxBackend,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from schemas.errors import SandboxError

LAUNCHER = Path(__file__).with_name("warm_main.py")
STANDBY_SHARES = 2  # cgroup v1 cpu.shares of a member before its claim (the default is 1024)
STOP_S = 60.0  # a killed member's sandbox is gone by then, or the backend failed
CONTROL = ".openforge-warm"  # in the member's home until its claim: ready, claim (a FIFO)


@dataclass(frozen=True)
class Shape:
    """Everything of an agent's :class:`SandboxSpec` that is fixed before its rollout: a member
    of one shape serves only specs of that shape. ``private`` are the rollout's own directories
    (inside path, read-only), the home apart; ``python`` and ``modules`` what the stand-by
    process runs and preloads. The image is its root filesystem's path, which the image store
    keys by the image's digest: a changed image is another shape, never served stale."""

    backend: SandboxBackend
    root: RootFs | None
    cwd: str
    proxy: ProxyEndpoint | None
    limits: Limits
    timeout_s: float
    fixed: tuple[Mount, ...]
    private: tuple[tuple[str, bool], ...]
    python: Path
    modules: tuple[str, ...]

    @classmethod
    def of(
        cls,
        spec: SandboxSpec,
        rollout_root: Path,
        backend: SandboxBackend,
        python: Path,
        modules: tuple[str, ...],
    ) -> Shape | None:
        """The shape of ``spec``, whose rollout's own files lie under ``rollout_root``; None when
        a warm member cannot serve it (files to collect, a rollout-private file mount)."""
        if spec.collect:
            return None
        fixed, private = [], []
        for m in spec.mounts:
            if m.inside == spec.home:
                continue
            if not m.host.is_relative_to(rollout_root):
                fixed.append(m)
            elif m.host.is_dir():
                private.append((m.inside, m.read_only))
            else:
                return None
        return cls(
            backend=backend,
            root=spec.root,
            cwd=spec.cwd,
            proxy=spec.proxy,
            limits=spec.limits,
            timeout_s=spec.timeout_s,
            fixed=tuple(sorted(fixed, key=lambda m: m.inside)),
            private=tuple(sorted(private)),
            python=python,
            modules=modules,
        )


class Member:
    """One pre-started sandbox of ``shape`` under ``directory`` (see the module doc)."""

    def __init__(self, shape: Shape, directory: Path, linger_s: float) -> None:
        self.shape = shape
        self.dir = directory
        self.home = directory / "home"
        self.control = self.home / CONTROL
        self.dirs = {
            inside: directory / f"private-{i}" for i, (inside, _) in enumerate(shape.private)
        }
        self.stdout, self.stderr = directory / "out", directory / "err"
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.started_at = time.monotonic()
        self.result: SandboxResult | None = None
        self.error: BaseException | None = None
        self._linger_s = linger_s
        self._fifo: int | None = None
        self._thread = threading.Thread(
            target=self._serve, name=f"warm-{directory.name}", daemon=True
        )

    # -- start -------------------------------------------------------------------------------

    def start(self) -> None:
        """Lay out the member's directories and start its sandbox (returns at once)."""
        for d in (self.home, self.control, *self.dirs.values()):
            d.mkdir(parents=True)
        os.mkfifo(self.control / "claim", 0o600)
        # Held open for writing until the claim: the stand-by process's open never blocks, and
        # the pool's end (this process gone) reaches it as EOF.
        self._fifo = os.open(self.control / "claim", os.O_RDWR | os.O_CLOEXEC)
        shutil.copyfile(LAUNCHER, self.home / LAUNCHER.name)
        if self.shape.root is not None and self.shape.root.uid != 0:
            for path in (self.home, self.control, self.control / "claim", *self.dirs.values()):
                os.chown(path, self.shape.root.uid, self.shape.root.gid)
        self._thread.start()

    def spec(self) -> SandboxSpec:
        """The member's own sandbox: the shape's, with its directories and the stand-by command."""
        s = self.shape
        mounts = [
            *s.fixed,
            Mount(self.home, str(self.home), read_only=False),
            *(Mount(self.dirs[inside], inside, read_only=ro) for inside, ro in s.private),
        ]
        argv = (str(s.python), "-I", str(self.home / LAUNCHER.name), str(self.control), *s.modules)
        return SandboxSpec(
            argv=argv,
            stdout=self.stdout,
            stderr=self.stderr,
            cwd=s.cwd,
            mounts=tuple(mounts),
            proxy=s.proxy,
            # Standing by at the lowest CPU weight: its start takes only CPU the running
            # rollouts leave; the claim gives it the rollout's weight back.
            limits=dataclasses.replace(s.limits, cpu_shares=STANDBY_SHARES),
            timeout_s=self._linger_s + s.timeout_s,
            home=str(self.home),
            root=s.root,
            cancelled=self.cancelled,
        )

    def _serve(self) -> None:
        try:
            self.result = self.shape.backend.run(self.spec())
        except BaseException as exc:  # handed to whoever waits on it
            self.error = exc
        finally:
            self.done.set()

    # -- health ------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Its stand-by process has preloaded and waits for a claim."""
        return not self.done.is_set() and (self.control / "ready").exists()

    def failure(self) -> str:
        """Why it ended before a claim (for the quarantine's log line)."""
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        tail = _tail(self.stderr)
        message = self.result.message if self.result is not None else "still running"
        return f"{message}{': ' + tail if tail else ''}"

    def discard(self, wait: bool = True) -> None:
        """Stop it (unclaimed, or failed) and remove its directory."""
        self.cancelled.set()
        self._close_fifo()
        if wait:
            self._thread.join(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _close_fifo(self) -> None:
        if self._fifo is not None:
            with contextlib.suppress(OSError):
                os.close(self._fifo)
            self._fifo = None

    # -- the rollout -------------------------------------------------------------------------

    def run(self, spec: SandboxSpec, rollout_root: Path, home_to: Path) -> SandboxResult:
        """Serve ``spec`` (built with :attr:`home` as its home); see the module doc."""
        claimed = time.monotonic()
        try:
            moved = self._move_in(spec, rollout_root)
        except BaseException:
            self.discard()  # never served: stopped, as the pool would have
            raise
        try:
            self._claim(spec)
            started = time.monotonic() - claimed
            expired = self._wait(spec, claimed)
            if self.control.exists():  # the stand-by process removes it once it read the claim
                raise SandboxError(
                    f"the warm sandbox ended before its command started: {self.failure()}"
                )
        except BaseException:
            self.cancelled.set()  # interrupted, or not ready after all: it ends here
            self._close_fifo()
            raise
        finally:
            self._move_out(spec, moved, home_to)
        if self.error is not None:
            raise SandboxError(f"the warm sandbox failed: {self.error}") from self.error
        assert self.result is not None
        result = dataclasses.replace(
            self.result, duration_s=time.monotonic() - claimed, start_s=started
        )
        if expired:
            return dataclasses.replace(
                result,
                outcome=SandboxOutcome.TIMED_OUT,
                exit_code=None,
                message=f"timed out after {spec.timeout_s:g}s; every process of the sandbox "
                "was killed",
            )
        return result

    def _move_in(self, spec: SandboxSpec, rollout_root: Path) -> list[tuple[Path, Path]]:
        s = self.shape
        if Shape.of(spec, rollout_root, s.backend, s.python, s.modules) != s:
            raise SandboxError(
                "a warm member was handed a spec of another shape: claim one for this spec"
            )
        if spec.home != str(self.home):
            raise SandboxError(f"the spec's home {spec.home} is not the member's {self.home}")
        moved: list[tuple[Path, Path]] = []
        try:
            for m in spec.mounts:
                if m.inside in self.dirs:
                    moved.append((m.host, self.dirs[m.inside]))
                    _adopt(m.host, self.dirs[m.inside])
        except OSError as exc:
            for host, mine in moved:  # the rollout's files back where they were laid out
                _move_entries(mine, host)
            raise SandboxError(f"cannot move the rollout's files into {self.dir}: {exc}") from exc
        return moved

    def _claim(self, spec: SandboxSpec) -> None:
        if self._fifo is None or not self.ready():
            raise SandboxError("the warm member is not ready: claim another")
        sandbox_id = (self.control / "ready").read_text().strip()
        if sandbox_id:
            self.shape.backend.set_cpu_shares(sandbox_id, spec.limits.cpu_shares or 1024)
        line = json.dumps({"argv": list(spec.argv), "env": dict(spec.env), "cwd": spec.cwd})
        os.write(self._fifo, line.encode() + b"\n")  # one write under PIPE_BUF or whole
        self._close_fifo()

    def _wait(self, spec: SandboxSpec, claimed: float) -> bool:
        """Until the sandbox ended; True when the rollout's deadline killed it."""
        deadline = claimed + spec.timeout_s
        while not self.done.wait(max(0.0, min(0.25, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                self.cancelled.set()
                if not self.done.wait(STOP_S):
                    raise SandboxError(f"the warm sandbox {self.dir} outlived its kill")
                return True
            if spec.cancelled is not None and spec.cancelled.is_set():
                self.cancelled.set()
        return False

    def _move_out(self, spec: SandboxSpec, moved: list[tuple[Path, Path]], home_to: Path) -> None:
        self.done.wait(STOP_S)  # nothing of the sandbox writes any more
        (self.home / LAUNCHER.name).unlink(missing_ok=True)  # the pool's, not the rollout's
        try:
            for host, mine in moved:
                _move_entries(mine, host)
            _move_entries(self.home, home_to)
            shutil.move(self.stdout, spec.stdout)
            if spec.stderr != spec.stdout:
                shutil.move(self.stderr, spec.stderr)
            else:
                with open(spec.stdout, "ab") as out:
                    out.write(self.stderr.read_bytes())
        except OSError as exc:  # nothing is deleted: what did not move stays in the member's
            raise SandboxError(
                f"cannot move the rollout's files out of {self.dir} ({exc}): they are left there"
            ) from exc
        shutil.rmtree(self.dir, ignore_errors=True)


def _adopt(source: Path, target: Path) -> None:
    """``source``'s entries into ``target`` (empty), which takes its owner and mode."""
    st = source.stat()
    os.chown(target, st.st_uid, st.st_gid)
    os.chmod(target, stat.S_IMODE(st.st_mode))
    _move_entries(source, target)


def _move_entries(source: Path, target: Path) -> None:
    for entry in list(source.iterdir()):
        shutil.move(entry, target / entry.name)


def _tail(path: Path, limit: int = 500) -> str:
    try:
        return path.read_text(errors="replace").strip()[-limit:]
    except OSError:
        return ""
