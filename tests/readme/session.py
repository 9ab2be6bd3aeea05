"""A newcomer's shell session over a copy of the repository: commands run as written, from the
copy's root, services started and stopped as a user would (Ctrl-C), placeholders filled from
what earlier commands printed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.paths import cache_dir
from tests.readme.commands import Block, Command

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Spec:
    """What a README command must do.

    Attributes:
        expect: regular expressions its output (stdout and stderr) must match.
        service: it runs until stopped: wait for ``ready`` in its output, stop it with SIGINT
            (Ctrl-C) at the end of its block, then it must exit 0.
        ready: a service's readiness, a regular expression over its output.
        capture: placeholders (e.g. ``PORT``) filled for later commands, each from the first
            group of a regular expression over this command's output.
        extra: appended to the command (the README says so where it does: the main job's
            short form).
        timeout: seconds it may take (a service: to become ready).
        check: called with the copy's root and the command's output once it has passed: a
            deeper look at what it left behind (the main job's run, for one).
    """

    expect: tuple[str, ...] = ()
    service: bool = False
    ready: str = ""
    capture: dict[str, str] = field(default_factory=dict)
    extra: str = ""
    timeout: float = 600.0
    check: Callable[[Path, str], None] | None = None


@dataclass
class _Service:
    command: Command
    spec: Spec
    process: subprocess.Popen[bytes]
    log: Path


class Session:
    """Commands in ``work`` (a copy of the repository), one at a time, as typed."""

    def __init__(self, work: Path, logs: Path, env: dict[str, str]) -> None:
        self.work, self.logs, self.env = work, logs, env
        self.values: dict[str, str] = {}
        self._services: list[_Service] = []
        self._n = 0

    def fill(self, text: str) -> str:
        """``text`` with every captured placeholder replaced by its value."""
        for name, value in self.values.items():
            text = re.sub(rf"\b{name}\b", value, text)
        return text

    def _log(self, command: Command) -> Path:
        self._n += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.logs / f"{self._n:02d}-line{command.line}.log"

    def run(self, command: Command, spec: Spec) -> str:
        """Run ``command`` to its end: exit 0, output matching ``spec``."""
        if spec.service:
            return self._start(command, spec)
        text = self.fill(command.text) + spec.extra
        log = self._log(command)
        with log.open("wb") as out:
            try:
                done = subprocess.run(
                    ["bash", "-c", text],
                    cwd=self.work,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=spec.timeout,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(f"{text!r} ran past {spec.timeout:.0f} s; log {log}") from exc
        output = log.read_text(errors="replace")
        assert done.returncode == 0, f"{text!r} exited {done.returncode}:\n{output[-4000:]}"
        self._check(text, spec, output)
        if spec.check is not None:
            spec.check(self.work, output)
        return output

    def _start(self, command: Command, spec: Spec) -> str:
        text = self.fill(command.text)
        log = self._log(command)
        process = subprocess.Popen(
            ["bash", "-c", f"exec {text}"],
            cwd=self.work,
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._services.append(_Service(command, spec, process, log))
        deadline = time.monotonic() + spec.timeout
        while True:
            output = log.read_text(errors="replace")
            if re.search(spec.ready, output):
                break
            assert process.poll() is None, (
                f"{text!r} exited {process.returncode}:\n{output[-4000:]}"
            )
            assert time.monotonic() < deadline, (
                f"{text!r} not ready in {spec.timeout:.0f} s; log {log}"
            )
            time.sleep(0.5)
        self._capture(spec, output)
        return output

    def run_block(self, block: Block, specs: Mapping[str, Spec], skip: str = "") -> None:
        """Every command of ``block`` but ``skip`` in turn, then its services stopped."""
        try:
            for command in block.commands:
                if command.text != skip:
                    self.run(command, specs[command.text])
        finally:
            self.stop_services()

    def stop_services(self, background: bool = False) -> None:
        """Ctrl-C every service, the last started first: each must stop and exit 0. A service
        written with a trailing ``&`` runs on in the background, as in a shell, until the session
        ends (``background``): a later block may use it."""
        failures: list[str] = []
        keep = [s for s in self._services if s.command.background and not background]
        stopping = [s for s in self._services if s not in keep]
        self._services = keep
        while stopping:
            service = stopping.pop()
            process = service.process
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    failures.append(f"{service.command.text!r} did not stop on Ctrl-C")
                    continue
            output = service.log.read_text(errors="replace")
            if process.returncode != 0:
                failures.append(
                    f"{service.command.text!r} exited {process.returncode} on Ctrl-C:\n"
                    + output[-3000:]
                )
                continue
            try:
                self._check(service.command.text, service.spec, output)
            except AssertionError as exc:
                failures.append(str(exc))
        assert not failures, "\n".join(failures)

    def _check(self, text: str, spec: Spec, output: str) -> None:
        flat = " ".join(output.split())  # rich wraps long lines at the terminal's width
        for pattern in spec.expect:
            found = re.search(pattern, output) or re.search(pattern, flat)
            assert found, f"{text!r} did not print {pattern!r}:\n{output[-4000:]}"
        self._capture(spec, output)

    def _capture(self, spec: Spec, output: str) -> None:
        for name, pattern in spec.capture.items():
            found = re.search(pattern, output, re.MULTILINE)
            assert found, f"no {name} ({pattern!r}) in:\n{output[-3000:]}"
            self.values[name] = found.group(1)


def copy_repository(root: Path, dest: Path) -> Path:
    """What a fresh clone of ``root`` holds (tracked and untracked, not ignored files), copied
    into ``dest``: no ``.venv``, no ``runs/``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = root / name
        if not source.is_file():  # deleted in the working tree
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


@contextmanager
def newcomer_session(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Session]:
    """A newcomer's session over a fresh copy of this checkout, named ``name`` (the README's
    first command sets the copy up: its own ``.venv``, hard links into the shared environment,
    which this checkout's ``.venv`` never sees). Afterwards the services left in the background
    are stopped."""
    base = tmp_path_factory.mktemp(name)
    work = copy_repository(ROOT, base / "openforge")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MYPY_CACHE_DIR"] = str(cache_dir() / "mypy")  # a warm cache; the command is as written
    session = Session(work, base / "logs", env)
    yield session
    session.stop_services(background=True)  # what ran on in the background must stop cleanly
