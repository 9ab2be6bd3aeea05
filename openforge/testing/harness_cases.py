"""What the scripted policy makes each real harness do: the task, and the tool call in the
harness's own schema (shared by the harness tests and ``bench/harness_rollouts.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.enums import ContinuityClass

TASK = "Create a file named hello.txt containing the words: hello from openforge"
CONTENT = "hello from openforge\n"


@dataclass(frozen=True)
class Case:
    tool: str
    arguments: dict[str, Any]  # "{ws}" stands for the rollout's workspace
    follow_up: ContinuityClass  # how the turn after the tool result relates to the first
    retry_streams: bool  # whether the harness retries a dropped stream with streaming
    retries_broken: bool = True  # whether it retries a stream broken mid-answer at all


CASES = {
    # Resends the full input each turn as an exact prefix; retries dropped streams as they were.
    "codex": Case(
        "exec_command",
        {"cmd": "printf 'hello from openforge\\n' > hello.txt"},
        ContinuityClass.EXACT,
        retry_streams=True,
    ),
    # Resends the history; falls back to stream:false after a broken stream.
    "claude-code": Case(
        "Write",
        {"file_path": "{ws}/hello.txt", "content": CONTENT},
        ContinuityClass.EXACT,
        retry_streams=False,
    ),
    # Resends the history as Chat Completions messages; retries a broken stream, streaming.
    "agent": Case(
        "shell",
        {"command": "printf 'hello from openforge\\n' > hello.txt"},
        ContinuityClass.EXACT,
        retry_streams=True,
    ),
    # Appends an internal-context message to every request (so the history is not a prefix)
    # and rewrites the prompt when it retries.
    "openclaw": Case(
        "write",
        {"path": "hello.txt", "content": CONTENT},
        ContinuityClass.INJECTED,
        retry_streams=True,
    ),
    # Qwen Code (Gemini CLI's fork): Chat Completions, its file tool takes an absolute path;
    # resends the history with each tool call's arguments re-serialized (compact JSON), so the
    # turn after a tool call is rewritten, not the model's exact tokens.
    "qwen-code": Case(
        "write_file",
        {"file_path": "{ws}/hello.txt", "content": CONTENT},
        ContinuityClass.REWRITTEN,
        retry_streams=False,
        retries_broken=False,  # it ends the session with the error ("[API Error: ...]")
    ),
    # OpenCode: Chat Completions through its OpenAI-compatible provider; asks for a title first
    # (its own thread); re-serializes tool-call arguments like Qwen Code.
    "opencode": Case(
        "write",
        {"filePath": "{ws}/hello.txt", "content": CONTENT},
        ContinuityClass.REWRITTEN,
        retry_streams=True,
    ),
}
