"""Agent harnesses run unmodified through the proxy: Codex CLI, Claude Code, OpenClaw, Qwen
Code, OpenCode, the built-in ``agent``, the ``oracle`` that runs a task's own solution and
``noop`` that does nothing (these two call no model)."""

from __future__ import annotations

from infra.harnesses.agent import Agent
from infra.harnesses.base import (
    Capabilities,
    Endpoint,
    Harness,
    Invocation,
    Network,
    Node24Harness,
    NpmHarness,
    PromptProfile,
    Report,
    RolloutDirs,
    ShellTool,
    Surface,
)
from infra.harnesses.browser import Browser, BrowserAnthropic
from infra.harnesses.claude_code import ClaudeCode
from infra.harnesses.codex import Codex
from infra.harnesses.openclaw import OpenClaw
from infra.harnesses.opencode import OpenCode
from infra.harnesses.oracle import NoOp, Oracle
from infra.harnesses.qwen_code import QwenCode
from schemas.registry import Registry

HARNESSES: Registry[type[Harness]] = Registry("harness")
_NPM = (Codex, ClaudeCode, OpenClaw, QwenCode, OpenCode)
for _cls in (*_NPM, Agent, Browser, BrowserAnthropic, Oracle, NoOp):
    HARNESSES.add(_cls.name, _cls)


def harness(name: str) -> Harness:
    """The harness called ``name`` (one of :data:`HARNESSES`), with default settings."""
    return HARNESSES.get(name)()


def model_harnesses(surface: Surface = Surface.WORKSPACE) -> list[str]:
    """The names of the harnesses that call a model and act on ``surface`` (the workspace: all
    but oracle, noop and the browser agents), sorted."""
    return [
        name
        for name in HARNESSES
        if HARNESSES[name].capabilities.calls_model
        and HARNESSES[name].capabilities.surface is surface
    ]


def shell_harnesses() -> list[str]:
    """The names of the harnesses with a tool that runs a command (what the harness-traffic
    warm start demonstrates with), sorted."""
    return [name for name in HARNESSES if HARNESSES[name].shell_tool is not None]


__all__ = [
    "HARNESSES",
    "Agent",
    "Browser",
    "BrowserAnthropic",
    "Capabilities",
    "ClaudeCode",
    "Codex",
    "Endpoint",
    "Harness",
    "Invocation",
    "Network",
    "NoOp",
    "Node24Harness",
    "NpmHarness",
    "OpenClaw",
    "OpenCode",
    "Oracle",
    "PromptProfile",
    "QwenCode",
    "Report",
    "RolloutDirs",
    "ShellTool",
    "Surface",
    "harness",
    "model_harnesses",
    "shell_harnesses",
]
