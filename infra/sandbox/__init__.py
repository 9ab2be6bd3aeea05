"""Rollout sandboxes: run a harness, or a task's verifier, in a fresh isolated sandbox.

One interface (:class:`SandboxBackend`: ``run(spec) -> result``) and two local backends:
``bubblewrap`` (namespaces and cgroup v1 limits over the host's own system directories) and
``runc`` (a container of the task's own image), both on one machine without Docker.
"""

from __future__ import annotations

from infra.sandbox.base import (
    SANDBOXES,
    Limits,
    Mount,
    ProxyEndpoint,
    RootFs,
    SandboxBackend,
    SandboxName,
    SandboxOutcome,
    SandboxResult,
    SandboxSpec,
)
from infra.sandbox.bubblewrap import BubblewrapSandbox, LimitEnforcement
from infra.sandbox.runc import RuncSandbox


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
    "RootFs",
    "RuncSandbox",
    "SandboxBackend",
    "SandboxName",
    "SandboxOutcome",
    "SandboxResult",
    "SandboxSpec",
    "sandbox",
]
