"""OpenAI Codex CLI: Responses API, always streaming, a custom provider in ``config.toml``.

Lean prompt (:class:`PromptProfile`): its documented ``model_instructions_file`` replaces the
built-in instructions with :data:`LEAN_INSTRUCTIONS`; the optional features that add tools and
instructions (goals, images, apps) are disabled, and so are the skills catalogue
(``skills.include_instructions``) and ``request_user_input``: 17.0k -> 2.3k prompt tokens with
the tiny model's tokenizer (``exec_command`` and ``write_stdin`` stay).
"""

from __future__ import annotations

import json

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

_CONFIG = """\
model = {model}
model_provider = "openforge"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
hide_agent_reasoning = true

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"

[model_providers.openforge]
name = "OpenForge proxy"
base_url = {base_url}
env_key = "OPENFORGE_API_KEY"
wire_api = "responses"
request_max_retries = {retries}
stream_max_retries = {retries}
stream_idle_timeout_ms = {idle_ms}
"""

# Config keys of the pinned version (``--strict-config`` accepts them) that a lean prompt sets:
# no skills catalogue (its paths differ per rollout), no request_user_input tool.
_LEAN_TABLES = """
[skills]
include_instructions = false

[tools.experimental_request_user_input]
enabled = false
"""

# Optional features whose tools and instructions a lean prompt leaves out.
_LEAN_DISABLED = [
    arg for feature in ("goals", "view_image", "image_generation", "apps")
    for arg in ("--disable", feature)
]  # fmt: skip


class Codex(NpmHarness):
    name = "codex"
    package = "@openai/codex"
    version_key = "CODEX_VERSION"
    binary = "codex"
    dialect = Dialect.RESPONSES
    shell_tool = ShellTool("exec_command", "cmd")

    def __init__(self, max_retries: int = 2, prompt: PromptProfile = PromptProfile.FULL) -> None:
        self.max_retries = max_retries
        self.prompt = prompt

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        codex_home = dirs.home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        config = _CONFIG.format(
            model=json.dumps(endpoint.model),
            base_url=json.dumps(f"{endpoint.rollout_base}/v1"),
            retries=self.max_retries,
            idle_ms=int(timeout_s * 1000),
        )
        if self.prompt is PromptProfile.LEAN:
            instructions = codex_home / "instructions.md"
            instructions.write_text(LEAN_INSTRUCTIONS + "\n")
            # A root key before the first table; the tables after the others.
            config = f"model_instructions_file = {json.dumps(str(instructions))}\n" + config
            config += _LEAN_TABLES
        (codex_home / "config.toml").write_text(config)
        env = self.base_env(dirs, endpoint)
        env.update(CODEX_HOME=str(codex_home), OPENFORGE_API_KEY=endpoint.api_key)
        argv = [
            str(self.executable()),
            "exec",
            "--skip-git-repo-check",
            "--json",
            "--ephemeral",
            "--disable",
            "plugins",
            *(_LEAN_DISABLED if self.prompt is PromptProfile.LEAN else []),
            "--cd",
            str(dirs.workspace),
            task,
        ]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """``--json`` prints one event per line: thread.started, item.completed, turn.*."""
        out = Report()
        for event in json_objects(stdout):
            kind = event.get("type")
            if kind == "thread.started":
                out.session_id = event.get("thread_id")
            elif kind == "item.completed":
                item = event.get("item") or {}
                if item.get("type") == "agent_message":
                    out.final_message = item.get("text")
            elif kind in ("turn.failed", "error"):
                err = event.get("error") or event.get("message")
                out.extra["error"] = str(err.get("message") if isinstance(err, dict) else err)
        return out
