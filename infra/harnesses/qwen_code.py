"""Qwen Code (Gemini CLI's fork for OpenAI-compatible servers): Chat Completions, streaming;
runs on the cache's Node 24 (it needs >= 22).

Configured by its documented flags: ``--auth-type openai`` with ``--openai-base-url`` and
``--openai-api-key`` (the rollout's), ``--yolo`` (headless: no approvals), ``-o stream-json``
(one event a line, ending in a ``result``), ``--chat-recording false`` (nothing kept for
``--resume``). Its settings file turns telemetry and usage statistics off.

Lean prompt (:class:`PromptProfile`): ``--bare`` (no context files, extensions, skills or
hooks), ``--system-prompt`` (:data:`LEAN_INSTRUCTIONS`) and ``--core-tools run_shell_command``
with the tools it still adds excluded (``--exclude-tools``): its shell tool alone.
"""

from __future__ import annotations

import json
import uuid

from infra.harnesses.base import (
    LEAN_INSTRUCTIONS,
    Endpoint,
    Invocation,
    Node24Harness,
    PromptProfile,
    Report,
    RolloutDirs,
    ShellTool,
    stream_json_report,
)
from schemas.enums import Dialect

_SETTINGS = {
    "telemetry": {"enabled": False},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}
# What --core-tools run_shell_command still registers, besides it (version 0.24.4).
_LEAN_EXCLUDED = "edit,get_goal,notebook_edit,read_file,update_goal"


class QwenCode(Node24Harness):
    name = "qwen-code"
    package = "@qwen-code/qwen-code"
    version_key = "QWEN_CODE_VERSION"
    binary = "qwen"
    dialect = Dialect.CHAT
    shell_tool = ShellTool("run_shell_command", "command")

    def __init__(self, prompt: PromptProfile = PromptProfile.FULL) -> None:
        self.prompt = prompt

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        settings = dirs.home / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(_SETTINGS, indent=2))
        env = self.base_env(dirs, endpoint)
        env.update(QWEN_CODE_SUPPRESS_YOLO_WARNING="1")
        argv = [
            str(self.executable()),
            task,
            "--auth-type",
            "openai",
            "--openai-base-url",
            f"{endpoint.rollout_base}/v1",
            "--openai-api-key",
            endpoint.api_key,
            "--model",
            endpoint.model,
            "--output-format",
            "stream-json",
            "--yolo",
            "--chat-recording",
            "false",
            "--session-id",
            str(uuid.uuid4()),
            "--max-wall-time",
            str(max(int(timeout_s), 1)),
        ]
        if self.prompt is PromptProfile.LEAN:
            argv += ["--bare", "--system-prompt", LEAN_INSTRUCTIONS]
            argv += ["--core-tools", "run_shell_command", "--exclude-tools", _LEAN_EXCLUDED]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """``stream-json`` ends with a ``result`` object carrying the answer and session id."""
        return stream_json_report(stdout)
