"""Read a parsed ``task.toml`` into the task model, checking each known key's type.

Types are checked strictly (a number is not a string, a boolean is not a number; an integer is
accepted where Harbor takes a float), and a wrong one is a :class:`~schemas.errors.TaskError`
naming the file and the dotted field, e.g. ``tasks/x/task.toml: [verifier] timeout_sec must be a
positive number of seconds, got 'ten' (str)``. Keys not known here are returned as ``extra``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from infra.tasks.model import (
    DEFAULT_AGENT_TIMEOUT_SEC,
    DEFAULT_BUILD_TIMEOUT_SEC,
    DEFAULT_VERIFIER_TIMEOUT_SEC,
    DEFAULT_WORKDIR,
    AgentSettings,
    EnvironmentSettings,
    TaskMetadata,
    VerifierSettings,
)
from schemas.errors import TaskError


def freeze(value: Any) -> Any:
    """A read-only deep copy: tables become read-only mappings, arrays tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


_SECONDS = "a positive number of seconds"


def _kind(value: Any) -> str:
    return type(value).__name__


class Section:
    """The keys of one table of task.toml; each getter takes its key out of the table, so that
    :meth:`rest` is what nobody asked for."""

    def __init__(self, table: Any, name: str | None, file: Path) -> None:
        self.name = name  # None: the top level
        self.file = file
        if not isinstance(table, Mapping):
            raise TaskError(f"{file}: [{name}] must be a table, got {table!r} ({_kind(table)})")
        self._table = dict(table)

    def field(self, key: str) -> str:
        return f"[{self.name}] {key}" if self.name else key

    def fail(self, key: str, what: str, value: Any) -> TaskError:
        return TaskError(
            f"{self.file}: {self.field(key)} must be {what}, got {value!r} ({_kind(value)}); "
            "fix it in task.toml or remove it to use the default"
        )

    def number(self, key: str, default: float, what: str = "a positive number") -> float:
        value = self._table.pop(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, what, value)
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        if not math.isfinite(seconds) or seconds <= 0:
            raise self.fail(key, what, value)
        return seconds

    def integer(self, key: str, default: int, minimum: int = 1) -> int:
        value = self._table.pop(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"an integer >= {minimum}", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._table.pop(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def optional_boolean(self, key: str) -> bool | None:
        if key not in self._table:
            return None
        value = self._table.pop(key)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def string(self, key: str, default: str) -> str:
        value = self._table.pop(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def optional_string(self, key: str) -> str | None:
        value = self._table.pop(key, None)
        if value is not None and not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self._table.pop(key, None)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "an array of strings", value)
        return tuple(value)

    def string_table(self, key: str) -> Mapping[str, str]:
        value = self._table.pop(key, {})
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise self.fail(key, "a table of string values", value)
        return MappingProxyType(dict(value))

    def size_mb(self, key: str) -> int | None:
        """Harbor's deprecated size strings: ``"2G"``, ``"512M"``, ``"1048576K"``."""
        value = self._table.pop(key, None)
        if value is None:
            return None
        what = 'a size such as "2G" or "512M"'
        if not isinstance(value, str):
            raise self.fail(key, what, value)
        text = value.strip().upper()
        scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(text[-1:])
        try:
            amount = float(text[:-1])
        except ValueError:
            amount = math.nan
        if scale is None or not math.isfinite(amount) or amount * scale < 1:
            raise self.fail(key, what, value)
        return int(amount * scale)

    def table(self, key: str) -> Section:
        return Section(self._table.pop(key, {}), key, self.file)

    def rest(self) -> Mapping[str, Any]:
        frozen: Mapping[str, Any] = freeze(self._table)
        return frozen


def metadata(section: Section) -> TaskMetadata:
    return TaskMetadata(
        author_name=section.optional_string("author_name"),
        author_email=section.optional_string("author_email"),
        difficulty=section.optional_string("difficulty"),
        category=section.optional_string("category"),
        tags=section.strings("tags") or (),
        extra=section.rest(),
    )


def agent(section: Section) -> AgentSettings:
    return AgentSettings(
        timeout_sec=section.number("timeout_sec", DEFAULT_AGENT_TIMEOUT_SEC, _SECONDS),
        extra=section.rest(),
    )


def verifier(section: Section) -> VerifierSettings:
    return VerifierSettings(
        timeout_sec=section.number("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC, _SECONDS),
        env=section.string_table("env"),
        extra=section.rest(),
    )


def environment(section: Section) -> EnvironmentSettings:
    memory = section.size_mb("memory")
    storage = section.size_mb("storage")
    defaults = EnvironmentSettings()
    settings = EnvironmentSettings(
        build_timeout_sec=section.number("build_timeout_sec", DEFAULT_BUILD_TIMEOUT_SEC, _SECONDS),
        docker_image=section.optional_string("docker_image"),
        cpus=section.integer("cpus", defaults.cpus),
        memory_mb=section.integer("memory_mb", defaults.memory_mb),
        storage_mb=section.integer("storage_mb", defaults.storage_mb),
        gpus=section.integer("gpus", defaults.gpus, minimum=0),
        gpu_types=section.strings("gpu_types"),
        allow_internet=section.optional_boolean("allow_internet"),
        env=section.string_table("env"),
        workdir=section.string("workdir", DEFAULT_WORKDIR),
        extra=section.rest(),
    )
    if not settings.workdir.startswith("/"):
        raise section.fail("workdir", "an absolute path", settings.workdir)
    # As in Harbor, the deprecated size strings override the *_mb keys.
    return dataclasses.replace(
        settings,
        memory_mb=settings.memory_mb if memory is None else memory,
        storage_mb=settings.storage_mb if storage is None else storage,
    )
