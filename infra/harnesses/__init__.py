"""Agent harnesses run unmodified through the proxy: Codex CLI, Claude Code, OpenClaw."""

from __future__ import annotations

from infra.harnesses.base import Endpoint, Harness, Invocation, Report, RolloutDirs
from infra.harnesses.claude_code import ClaudeCode
from infra.harnesses.codex import Codex
from infra.harnesses.openclaw import OpenClaw
from schemas.errors import ConfigError

HARNESSES: dict[str, type[Harness]] = {h.name: h for h in (Codex, ClaudeCode, OpenClaw)}


def harness(name: str) -> Harness:
    """The harness called ``name`` (codex, claude-code, openclaw), with default settings."""
    try:
        return HARNESSES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown harness {name!r}: choose one of {', '.join(sorted(HARNESSES))}"
        ) from None


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
