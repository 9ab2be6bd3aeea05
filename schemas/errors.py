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


class TaskError(ConfigError):
    """A task directory, task.toml or dataset manifest is malformed; the message names the file
    and the field, and says how to fix it."""


class SetupError(OpenForgeError):
    """Something the set-up script installs is missing; run ``scripts/setup``."""


class ServiceError(OpenForgeError):
    """A local service (Kafka broker, vLLM server, proxy) failed to start or crashed."""


class SchemaError(OpenForgeError):
    """A record does not match its schema, or was written by a newer, unknown schema version."""


class EventLogError(OpenForgeError):
    """The event log (Kafka or the local log) refused an operation.

    Backend failures are always one of the two subclasses, so a caller can tell an outage from
    a damaged record. ``EventLogError`` itself means the log was used wrongly (an invalid topic or
    group name, committing an offset that was not polled); the message says what to pass instead.
    """


class EventLogUnavailable(EventLogError):
    """The event log cannot be reached or written now: broker down, connection refused, a
    timeout, a disk error. Retrying later may work (the proxy spools records meanwhile)."""


class EventLogCorrupt(EventLogError):
    """A record cannot be read: crc mismatch, an entry that is not the offset it should be, or an
    offset outside the log. Retrying does not help; the message names the record and the fix."""


class InfrastructureError(OpenForgeError):
    """A rollout failed for a reason that is not the agent's doing (the sandbox did not start,
    the proxy was unreachable, the verifier crashed or wrote no reward); the orchestrator
    retries it with backoff and counts it."""


class SandboxError(OpenForgeError):
    """A rollout sandbox could not be set up or torn down (a bad spec, a limit it cannot enforce,
    processes that would not die); the message names the setting or the next step."""


class QueryError(OpenForgeError):
    """SQL over a run's archive failed (a syntax error, an unknown view or column); the message
    has the database's own message and the list of views."""
