"""OpenClaw: a pinned JSON config with one custom provider; runs on its own Node 24.

Lean prompt (:class:`PromptProfile`): OpenClaw owns its system prompt (no override), so its
documented ``tools.allow`` (``exec`` only, no tool search), ``agents.defaults.skills = []`` and
``skipBootstrap`` / ``contextInjection = "never"`` (no workspace files injected) shorten it:
24.8k -> 6.2k prompt tokens with the tiny model's tokenizer.
"""

from __future__ import annotations

import json

from infra.harnesses.base import (
    Endpoint,
    Invocation,
    Node24Harness,
    PromptProfile,
    Report,
    RolloutDirs,
    ShellTool,
)
from schemas.enums import Dialect

# The provider API OpenClaw uses for each dialect the proxy speaks.
_API = {
    Dialect.CHAT: "openai-completions",
    Dialect.RESPONSES: "openai-responses",
    Dialect.MESSAGES: "anthropic-messages",
}


class OpenClaw(Node24Harness):
    name = "openclaw"
    package = "openclaw"
    version_key = "OPENCLAW_VERSION"
    binary = "openclaw"
    dialect = Dialect.CHAT
    shell_tool = ShellTool("exec", "command")

    def __init__(
        self,
        dialect: Dialect = Dialect.CHAT,
        context_window: int = 131072,
        prompt: PromptProfile = PromptProfile.FULL,
    ) -> None:
        self.dialect = dialect  # type: ignore[misc]
        self.context_window = context_window
        self.prompt = prompt

    def config(self, endpoint: Endpoint) -> dict[str, object]:
        base = endpoint.rollout_base + ("" if self.dialect is Dialect.MESSAGES else "/v1")
        config = self._provider_config(base, endpoint)
        if self.prompt is PromptProfile.LEAN:
            defaults: dict[str, object] = config["agents"]["defaults"]  # type: ignore[index]
            defaults.update(skills=[], skipBootstrap=True, contextInjection="never")
            config["tools"] = {"allow": ["exec"], "toolSearch": False}
        return config

    def _provider_config(self, base: str, endpoint: Endpoint) -> dict[str, object]:
        return {
            "models": {
                "mode": "replace",
                "providers": {
                    "openforge": {
                        "baseUrl": base,
                        "apiKey": endpoint.api_key,
                        "api": _API[self.dialect],
                        "models": [
                            {
                                "id": endpoint.model,
                                "name": endpoint.model,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": self.context_window,
                                "maxTokens": 4096,
                            }
                        ],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"openforge/{endpoint.model}"}}},
            "update": {"checkOnStart": False},
            "telemetry": {"enabled": False},
        }

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        config = dirs.home / "openclaw.json"
        config.write_text(json.dumps(self.config(endpoint), indent=2))
        state = dirs.home / "state"
        state.mkdir(exist_ok=True)
        env = self.base_env(dirs, endpoint)
        env.update(
            OPENCLAW_NO_AUTO_UPDATE="1",
            OPENCLAW_DISABLE_BONJOUR="1",
            OPENCLAW_STATE_DIR=str(state),
        )
        argv = [
            str(self.executable()),
            "agent",
            "exec",
            "--config",
            str(config),
            "--json",
            "--cwd",
            str(dirs.workspace),
            "--state-dir",
            str(state),
            "--model",
            f"openforge/{endpoint.model}",
            "--timeout",
            str(max(int(timeout_s), 1)),
            task,
        ]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """``--json`` prints one envelope: ``final``, ``sessionId``, ``status``."""
        out = Report()
        start = stdout.find("{")
        try:
            envelope = json.loads(stdout[start:]) if start >= 0 else None
        except ValueError:
            envelope = None
        if isinstance(envelope, dict):
            final = envelope.get("final")
            out.final_message = final if isinstance(final, str) else None
            out.session_id = envelope.get("sessionId")
            out.extra["status"] = str(envelope.get("status"))
            if envelope.get("error"):
                out.extra["error"] = json.dumps(envelope["error"])[:500]
        return out
