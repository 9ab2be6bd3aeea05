"""Rollout sandboxes: run a harness, or a task's verifier, in a fresh isolated sandbox.

One interface (:class:`SandboxBackend`: ``run(spec) -> result``) and the local backend,
``bubblewrap`` (namespaces and cgroup v1 limits on one machine, no Docker).
"""

from __future__ import annotations

from infra.sandbox.base import (
    SANDBOXES,
    Limits,
    Mount,
    ProxyEndpoint,
    SandboxBackend,
    SandboxName,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.bubblewrap import BubblewrapSandbox, LimitEnforcement


def sandbox(name: str = SandboxName.BUBBLEWRAP) -> SandboxBackend:
    """The sandbox backend called ``name``, with default settings."""
    return SANDBOXES.get(name)()


__all__ = [
    "SANDBOXES",
    "BubblewrapSandbox",
    "LimitEnforcement",
    "Limits",
    "Mount",
    "ProxyEndpoint",
    "SandboxBackend",
    "SandboxName",
    "SandboxOutcome",
    "SandboxResult",
    "SandboxSpec",
    "sandbox",
]
