"""OpenCode (sst/opencode): Chat Completions, streaming, through its bundled OpenAI-compatible
provider; a native binary (no Node at run time).

Configured by its documented ``OPENCODE_CONFIG_CONTENT`` (the whole config, inline): one
provider ``openforge`` at the rollout's base URL and key, its ``model`` and ``small_model`` (the
title it asks for first goes to the policy too, and is recorded), autoupdate and sharing off.
Its ``OPENCODE_DISABLE_*`` variables keep it from fetching the models catalogue, plugins or
language servers (the sandbox reaches the proxy only). ``opencode run --format json`` prints one
event a line with the session id; the answer is its last ``text`` part.

Lean prompt (:class:`PromptProfile`): its ``build`` agent's ``prompt`` (:data:`LEAN_INSTRUCTIONS`)
and ``tools`` turned off but ``bash``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.harnesses.base import (
    LEAN_INSTRUCTIONS,
    Endpoint,
    Invocation,
    NpmHarness,
    PromptProfile,
    Report,
    RolloutDirs,
    ShellTool,
    json_objects,
)
from schemas.enums import Dialect

# Its tools besides bash (version 1.18.33), off in a lean prompt.
_LEAN_OFF = ("edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")
_QUIET = {
    f"OPENCODE_DISABLE_{what}": "1"
    for what in ("MODELS_FETCH", "AUTOUPDATE", "LSP_DOWNLOAD", "DEFAULT_PLUGINS")
}


class OpenCode(NpmHarness):
    name = "opencode"
    package = "opencode-ai"
    version_key = "OPENCODE_VERSION"
    binary = "opencode"
    dialect = Dialect.CHAT
    shell_tool = ShellTool("bash", "command")

    def __init__(self, prompt: PromptProfile = PromptProfile.FULL) -> None:
        self.prompt = prompt

    def read_only_paths(self) -> list[Path]:
        """Its install only: the package's postinstall put the native binary in it."""
        self.executable()
        return [self.install_dir().resolve()]

    def install_files(self) -> list[Path]:
        """The launcher link and the package that holds the binary, not the second copy of it
        that npm keeps in the platform package."""
        modules = self.install_dir() / "node_modules"
        return [self.executable(), (modules / "opencode-ai").resolve()]

    def config(self, endpoint: Endpoint) -> dict[str, Any]:
        model = f"openforge/{endpoint.model}"
        options = {"baseURL": f"{endpoint.rollout_base}/v1", "apiKey": endpoint.api_key}
        config: dict[str, Any] = {
            "provider": {
                "openforge": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "OpenForge proxy",
                    "options": options,
                    "models": {endpoint.model: {"name": endpoint.model}},
                }
            },
            "model": model,
            "small_model": model,
            "autoupdate": False,
            "share": "disabled",
        }
        if self.prompt is PromptProfile.LEAN:
            config["tools"] = {tool: False for tool in _LEAN_OFF}
            config["agent"] = {"build": {"prompt": LEAN_INSTRUCTIONS}}
        return config

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        env = self.base_env(dirs, endpoint)
        env.update(_QUIET, OPENCODE_CONFIG_CONTENT=json.dumps(self.config(endpoint)))
        argv = [
            str(self.executable()),
            "run",
            "--model",
            f"openforge/{endpoint.model}",
            "--format",
            "json",
            task,
        ]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """``--format json``: one event a line (``step_start``, ``text``, ``tool_use``,
        ``step_finish``, ``error``), each with the ``sessionID``."""
        out = Report()
        for event in json_objects(stdout):
            out.session_id = event.get("sessionID") or out.session_id
            part = event.get("part") or {}
            if event.get("type") == "text" and isinstance(part.get("text"), str):
                out.final_message = part["text"]
            elif event.get("type") == "error":
                out.extra["error"] = json.dumps(event.get("error"))[:500]
        return out
