"""Agent harnesses run unmodified through the proxy: Codex CLI, Claude Code, OpenClaw."""

from __future__ import annotations

from infra.harnesses.base import Endpoint, Harness, Invocation, Report, RolloutDirs
from infra.harnesses.claude_code import ClaudeCode
from infra.harnesses.codex import Codex
from infra.harnesses.openclaw import OpenClaw
from schemas.registry import Registry

HARNESSES: Registry[type[Harness]] = Registry("harness")
for _cls in (Codex, ClaudeCode, OpenClaw):
    HARNESSES.add(_cls.name, _cls)


def harness(name: str) -> Harness:
    """The harness called ``name`` (codex, claude-code, openclaw), with default settings."""
    return HARNESSES.get(name)()


__all__ = [
    "HARNESSES",
    "ClaudeCode",
    "Codex",
    "Endpoint",
    "Harness",
    "Invocation",
    "OpenClaw",
    "Report",
    "RolloutDirs",
    "harness",
]
