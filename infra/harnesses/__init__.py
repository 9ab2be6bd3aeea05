"""Agent harnesses run unmodified through the proxy: Codex CLI, Claude Code, OpenClaw, the
built-in ``agent``, the ``oracle`` that runs a task's own solution and ``noop`` that does nothing
(these two call no model)."""

from __future__ import annotations

from infra.harnesses.agent import Agent
from infra.harnesses.base import (
    Capabilities,
    Endpoint,
    Harness,
    Invocation,
    Network,
    NpmHarness,
    Report,
    RolloutDirs,
)
from infra.harnesses.claude_code import ClaudeCode
from infra.harnesses.codex import Codex
from infra.harnesses.openclaw import OpenClaw
from infra.harnesses.oracle import NoOp, Oracle
from schemas.registry import Registry

HARNESSES: Registry[type[Harness]] = Registry("harness")
for _cls in (Codex, ClaudeCode, OpenClaw, Agent, Oracle, NoOp):
    HARNESSES.add(_cls.name, _cls)


def harness(name: str) -> Harness:
    """The harness called ``name`` (agent, claude-code, codex, noop, openclaw, oracle), with
    default settings."""
    return HARNESSES.get(name)()


def model_harnesses() -> list[str]:
    """The names of the harnesses that call a model (all but oracle and noop), sorted."""
    return [name for name in HARNESSES if HARNESSES[name].capabilities.calls_model]


__all__ = [
    "HARNESSES",
    "Agent",
    "Capabilities",
    "ClaudeCode",
    "Codex",
    "Endpoint",
    "Harness",
    "Invocation",
    "Network",
    "NoOp",
    "NpmHarness",
    "OpenClaw",
    "Oracle",
    "Report",
    "RolloutDirs",
    "harness",
    "model_harnesses",
]
