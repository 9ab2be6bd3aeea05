"""``agent``: OpenForge's built-in multi-turn agent (``agent_main.py``) as a harness.

The script imports only the standard library and the OpenAI SDK, so it runs in a sandbox that
sees nothing of this repository: the harness copies it into the rollout's home and runs it with
a Python that has ``openai`` installed (by default the one running OpenForge, whose venv
``scripts/setup project`` builds). That interpreter is what a sandbox must mount read-only:
the venv, the base interpreter's binary, its standard library and its ``libpython``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from infra.harnesses.base import (
    Endpoint,
    Harness,
    Invocation,
    Preload,
    Report,
    RolloutDirs,
    ShellTool,
    json_objects,
)
from infra.harnesses.python_files import python_files
from infra.paths import shared_env
from schemas.enums import Dialect
from schemas.errors import SetupError

# The script, read as a file (importing it would import openai here, where it may be absent).
SCRIPT = Path(__file__).with_name("agent_main.py")
API_KEY_ENV = "OPENFORGE_API_KEY"  # = agent_main.API_KEY_ENV
# What a warm sandbox imports ahead (Agent.preload): the SDK's chat resources, which it loads
# lazily on the first call (~17 ms), and the standard modules the script imports.
PRELOAD = ("openai.resources.chat", "openai.types.chat", "httpx", "argparse", "subprocess", "uuid")

# Run by the interpreter itself: where its parts are, and whether it has the SDK.
_PROBE = """
import json, os, sys, sysconfig
v = sysconfig.get_config_vars()
lib = None
if v.get("Py_ENABLE_SHARED") and v.get("LIBDIR") and v.get("INSTSONAME"):
    lib = os.path.join(v["LIBDIR"], v["INSTSONAME"])
try:
    import openai
    sdk = openai.__version__
except ImportError:
    sdk = None
print(json.dumps({
    "prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
    "stdlib": sysconfig.get_path("stdlib"), "purelib": sysconfig.get_path("purelib"),
    "platlib": sysconfig.get_path("platlib"), "libpython": lib, "openai": sdk,
}))
"""


@functools.cache
def _script() -> ModuleType:
    """The agent script as a module (it imports ``openai`` only where it calls the model)."""
    spec = importlib.util.spec_from_file_location("openforge_agent_main", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_messages(task: str, cwd: str, command_timeout_s: float) -> list[dict[str, Any]]:
    """The messages the agent starts a rollout with (its system prompt, then the task)."""
    return list(_script().initial_messages(task, cwd, command_timeout_s))


def shell_tool() -> dict[str, Any]:
    """The one tool the agent offers the model."""
    return dict(_script().SHELL_TOOL)


def tool_message(call_id: str, result: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
    """The tool message the agent sends after running a command with this ``result``
    (``exit_code``, ``stdout``, ``stderr``, ``timed_out``)."""
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": _script().result_text(result, timeout_s),
    }


@dataclass(frozen=True)
class Interpreter:
    """A Python as a sandbox sees it: the path to run and what to mount for it."""

    argv0: Path  # the interpreter, symlinked directories resolved (the venv's bin/python)
    paths: tuple[Path, ...]  # to mount read-only, resolved, none inside another
    openai_version: str


def _outermost(paths: list[Path]) -> tuple[Path, ...]:
    unique = sorted(set(paths))
    return tuple(p for p in unique if not any(q != p and p.is_relative_to(q) for q in unique))


@functools.cache
def _own_python() -> Path:
    """This process's interpreter, from the shared environment when this is a checkout's
    ``.venv`` (:func:`infra.paths.shared_env`: the same files): a path every checkout shares,
    outside the checkout (a pod's own ``/tmp`` hides a checkout under ``/tmp``)."""
    shared = shared_env(Path(sys.prefix)) / "bin" / Path(sys.executable).name
    return shared if shared.exists() else Path(sys.executable)


@functools.cache
def interpreter(python: Path) -> Interpreter:
    """Ask ``python`` where its parts are (once per path)."""
    fix = "Point the agent harness at a Python with the openai SDK, or run `scripts/setup project`"
    try:
        out = subprocess.run(
            [str(python), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"cannot run {python} for the agent harness ({exc}). {fix}.") from exc
    if out.returncode != 0:
        raise SetupError(f"{python} failed to start: {out.stderr.strip()[-500:]}. {fix}.")
    info = json.loads(out.stdout)
    if info["openai"] is None:
        raise SetupError(f"{python} has no openai package, which the agent harness needs. {fix}.")
    prefix = Path(info["prefix"]).resolve()
    executable = Path(info["executable"])
    try:
        argv0 = prefix / executable.relative_to(info["prefix"])
    except ValueError:
        argv0 = executable.parent.resolve() / executable.name
    parts = [prefix, executable.resolve(), Path(info["stdlib"]).resolve()]
    if info["libpython"] and Path(info["libpython"]).exists():
        parts.append(Path(info["libpython"]).resolve())
    if info["prefix"] == info["base_prefix"]:  # not a venv: its site-packages
        parts += [Path(info["purelib"]).resolve(), Path(info["platlib"]).resolve()]
    parts += _links(argv0)
    return Interpreter(argv0, _outermost(parts), info["openai"])


def _links(path: Path) -> list[Path]:
    """Every symlink on the way from ``path`` to the interpreter (a venv's ``bin/python`` ->
    ``python3`` -> the base installation's ``bin/python3`` -> ...): a sandbox over another root
    filesystem (an image) has none of them unless each is mounted."""
    out: list[Path] = []
    while path.is_symlink() and len(out) < 40:
        out.append(path)
        path = (path.parent / os.readlink(path)).absolute()
    return out


class Agent(Harness):
    name = "agent"
    dialect = Dialect.CHAT
    shell_tool = ShellTool("shell", "command")
    packages: ClassVar[tuple[str, ...]] = ("openai",)  # what its script imports, beyond stdlib

    def __init__(
        self,
        python: Path | str | None = None,
        max_turns: int = 8,
        command_timeout_s: float = 120.0,
        max_output_chars: int = 16000,
        max_tokens: int | None = None,
        retries: int = 2,
    ) -> None:
        self.python = Path(python) if python else _own_python()
        self.max_turns = max_turns
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.max_tokens = max_tokens
        self.retries = retries

    @property
    def version(self) -> str:
        """A digest of the script: what ran is what is recorded."""
        return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:12]

    def executable(self) -> Path:
        return interpreter(self.python).argv0

    def read_only_paths(self) -> list[Path]:
        return list(interpreter(self.python).paths)

    def install_files(self) -> list[Path]:
        """The interpreter and the packages its script imports (:attr:`packages`) with what
        they require, not the whole venv."""
        argv0 = interpreter(self.python).argv0
        return sorted({*_links(argv0), argv0.resolve(), *python_files(argv0, list(self.packages))})

    def bin_dirs(self) -> list[Path]:
        # Not the venv's bin: the agent's commands must find the sandbox's own python3.
        return []

    def preload(self) -> Preload:
        """Its interpreter, with the SDK and the standard modules its script imports."""
        return Preload(self.executable(), (*self.packages, *PRELOAD))

    def prepare(
        self, scripts: tuple[Path, ...], task: str, endpoint: Endpoint, dirs: RolloutDirs
    ) -> tuple[Path, Path, dict[str, str]]:
        """The rollout's copy of ``scripts`` in its home (the first one's path is returned), the
        task's file beside them, and the environment with the rollout's key."""
        for script in scripts:
            (dirs.home / script.name).write_bytes(script.read_bytes())
        task_file = dirs.home / "task.md"
        task_file.write_text(task, encoding="utf-8")
        env = self.base_env(dirs, endpoint)
        env[API_KEY_ENV] = endpoint.api_key
        return dirs.home / scripts[0].name, task_file, env

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        script, task_file, env = self.prepare((SCRIPT,), task, endpoint, dirs)
        argv = [
            str(self.executable()),
            "-I",  # no PYTHON* variables, no user site, not the script's directory on sys.path
            str(script),
            "--base-url",
            f"{endpoint.rollout_base}/v1",
            "--model",
            endpoint.model,
            "--task-file",
            str(task_file),
            "--max-turns",
            str(self.max_turns),
            # Its own deadline a little before the runner's, so that it ends on its own.
            "--time-limit",
            str(max(timeout_s * 0.95 - 1.0, 1.0)),
            "--command-timeout",
            str(self.command_timeout_s),
            "--max-output-chars",
            str(self.max_output_chars),
            "--retries",
            str(self.retries),
        ]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """The last ``final`` line: final message, session id, why it stopped, turns."""
        out = Report()
        for event in json_objects(stdout):
            kind = event.get("type")
            if kind == "start":
                out.session_id = event.get("session_id")
            elif kind == "final":
                final = event.get("final_message")
                out.final_message = final if isinstance(final, str) else None
                out.session_id = event.get("session_id") or out.session_id
                out.extra["stop"] = str(event.get("stop"))
                out.extra["turns"] = str(event.get("turns"))
            elif kind == "error" and not event.get("retrying"):
                out.extra["error"] = str(event.get("message"))[:500]
        return out
