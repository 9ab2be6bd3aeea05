"""Anthropic Claude Code: Messages API (streaming, with a ``stream:false`` fallback).

Lean prompt (:class:`PromptProfile`): its documented ``--bare`` (no CLAUDE.md discovery,
attribution or hooks), ``--tools Bash`` and ``--system-prompt`` (:data:`LEAN_INSTRUCTIONS`):
30.2k -> 1.4k prompt tokens with the tiny model's tokenizer.
"""

from __future__ import annotations

import os
import uuid

from infra.harnesses.base import (
    LEAN_INSTRUCTIONS,
    Endpoint,
    Invocation,
    NpmHarness,
    PromptProfile,
    Report,
    RolloutDirs,
    ShellTool,
    stream_json_report,
)
from schemas.enums import Dialect


class ClaudeCode(NpmHarness):
    name = "claude-code"
    package = "@anthropic-ai/claude-code"
    version_key = "CLAUDE_CODE_VERSION"
    binary = "claude"
    dialect = Dialect.MESSAGES
    shell_tool = ShellTool("Bash", "command")

    def __init__(self, max_retries: int = 2, prompt: PromptProfile = PromptProfile.FULL) -> None:
        self.max_retries = max_retries
        self.prompt = prompt

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        env = self.base_env(dirs, endpoint)
        env.update(
            ANTHROPIC_BASE_URL=endpoint.rollout_base,
            ANTHROPIC_API_KEY=endpoint.api_key,
            ANTHROPIC_MODEL=endpoint.model,
            # Side calls (titles, summaries) go to the same policy, so they are recorded too.
            ANTHROPIC_SMALL_FAST_MODEL=endpoint.model,
            ANTHROPIC_DEFAULT_HAIKU_MODEL=endpoint.model,
            CLAUDE_CONFIG_DIR=str(dirs.home / ".claude"),
            CLAUDE_CODE_MAX_RETRIES=str(self.max_retries),
            API_TIMEOUT_MS=str(int(timeout_s * 1000)),
            DISABLE_TELEMETRY="1",
            DISABLE_AUTOUPDATER="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_BUG_COMMAND="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            # Its documented opt-out of the attribution line it otherwise puts first in the
            # system prompt ("x-anthropic-billing-header: cc_version=2.1.332.<hash>; ..."): the
            # hash differs per session, so no two rollouts would share a prompt prefix (none
            # for vLLM's prefix cache, none for a batch's shared prefix in training).
            CLAUDE_CODE_ATTRIBUTION_HEADER="0",
        )
        if os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # it refuses to skip permissions as root otherwise
        argv = [
            str(self.executable()),
            "-p",
            task,
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            endpoint.model,
            "--session-id",
            str(uuid.uuid4()),
        ]
        if self.prompt is PromptProfile.LEAN:
            argv += ["--bare", "--tools", "Bash", "--system-prompt", LEAN_INSTRUCTIONS]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """``stream-json`` ends with a ``result`` object carrying the answer and session id."""
        return stream_json_report(stdout)
