"""OpenForge's error hierarchy.

Every error we raise on purpose derives from :class:`OpenForgeError`, and its message says what to
do next. Foreign exceptions are translated at the boundary with ``raise Ours(...) from exc``.
This module lives in ``schemas`` because every other package depends on ``schemas`` (and it on
nothing of ours), so all of them can share one hierarchy without an import cycle.
"""

from __future__ import annotations


class OpenForgeError(Exception):
    """Base class of every error OpenForge raises on purpose."""


class ConfigError(OpenForgeError):
    """A setting, path or argument is wrong; the message names it and a valid choice."""


class SetupError(OpenForgeError):
    """Something the set-up script installs is missing; run ``scripts/setup``."""


class ServiceError(OpenForgeError):
    """A local service (Kafka broker, vLLM server, proxy) failed to start or crashed."""


class SchemaError(OpenForgeError):
    """A record does not match its schema, or was written by a newer, unknown schema version."""


class EventLogError(OpenForgeError):
    """The event log (Kafka or the local log) refused an operation."""


class SandboxError(OpenForgeError):
    """A rollout sandbox could not be set up or torn down (a bad spec, a limit it cannot enforce,
    processes that would not die); the message names the setting or the next step."""
