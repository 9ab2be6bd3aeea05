"""``browser``: OpenForge's browser agent (``browser_main.py``) as a harness.

The agent drives headless Chromium inside the rollout's sandbox over the DevTools protocol
(``browser_cdp.py``) and asks the model for its actions as tool calls, through the proxy, in the
OpenAI Chat Completions dialect (``browser``) or Anthropic Messages (``browser-anthropic``). Both
scripts use the standard library only; they are copied into the rollout's home and run with the
same interpreter as the built-in ``agent`` (mounted read-only). Chromium is the task's: a web
task's image ships Debian's ``chromium`` (on PATH), and serves the task's app.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import Path

from infra.harnesses.agent import Agent
from infra.harnesses.base import Capabilities, Endpoint, Invocation, RolloutDirs, Surface
from schemas.enums import Dialect
from schemas.errors import ConfigError

SCRIPTS = tuple(
    Path(__file__).with_name(name)
    for name in ("browser_main.py", "browser_cdp.py", "browser_tree.py")
)


class Observation(StrEnum):
    """What the browser agent shows the model of the page."""

    TEXT = "text"  # the accessibility tree, controls numbered
    SCREENSHOT = "screenshot"  # a screenshot (needs a vision-language model)
    BOTH = "both"  # the tree and a screenshot


OBSERVATIONS = tuple(o.value for o in Observation)
_DIALECT_ARG = {Dialect.CHAT: "chat", Dialect.MESSAGES: "messages"}


class Browser(Agent):
    """The browser agent; ``observation`` is what the model is shown of the page: ``text``
    (the accessibility tree), ``screenshot`` or ``both``."""

    name = "browser"
    dialect = Dialect.CHAT
    capabilities = Capabilities(surface=Surface.BROWSER)
    packages = ()  # the standard library only: the interpreter alone goes into an image

    def __init__(
        self,
        python: Path | str | None = None,
        max_turns: int = 8,
        max_tokens: int | None = None,
        retries: int = 2,
        observation: str = "text",
    ) -> None:
        super().__init__(python, max_turns=max_turns, max_tokens=max_tokens, retries=retries)
        if observation not in OBSERVATIONS:
            raise ConfigError(f"observation must be one of {OBSERVATIONS}, not {observation!r}")
        self.observation = observation

    @property
    def version(self) -> str:
        """A digest of its scripts."""
        digest = hashlib.sha256()
        for script in SCRIPTS:
            digest.update(script.read_bytes())
        return digest.hexdigest()[:12]

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        script, task_file, env = self.prepare(SCRIPTS, task, endpoint, dirs)
        argv = [
            str(self.executable()),
            "-I",
            str(script),
            "--base-url",
            endpoint.rollout_base,
            "--dialect",
            _DIALECT_ARG[self.dialect],
            "--model",
            endpoint.model,
            "--task-file",
            str(task_file),
            "--observation",
            self.observation,
            "--max-turns",
            str(self.max_turns),
            "--time-limit",
            str(max(timeout_s * 0.95 - 1.0, 1.0)),
            "--retries",
            str(self.retries),
        ]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        return Invocation(argv, env, dirs.workspace)


class BrowserAnthropic(Browser):
    """The browser agent speaking Anthropic Messages."""

    name = "browser-anthropic"
    dialect = Dialect.MESSAGES
