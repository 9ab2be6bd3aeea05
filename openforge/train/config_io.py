"""Reading the config of ``openforge train`` (:mod:`openforge.train.config`): TOML and
``--set section.key=value`` overrides, relative paths against the file's directory.

    cfg = load_config(Path("examples/cpu-demo.toml"), ["trainer.lr=0", "run.seed=2"])

Unknown sections or keys are an error naming the nearest valid one; values are checked against
the field's type (enums list their choices) when the config is built, before anything starts.
``describe()`` prints every field (``openforge train --show-config``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
import types
import typing
from collections.abc import Iterator
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, TypeVar

from infra.eventlog.urls import absolute_location
from openforge.train.config import BUILT, TrainConfig
from schemas.errors import ConfigError
from schemas.registry import choose

T = TypeVar("T")


def _nearest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid: {', '.join(choices)}"


def _coerce(where: str, kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        return choose(kind, value, where)
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        (item,) = typing.get_args(kind)
        if isinstance(value, list):
            return [_coerce(f"{where}[{i}]", item, v) for i, v in enumerate(value)]
    elif origin is dict:
        key_kind, item = typing.get_args(kind)
        if isinstance(value, dict):
            return {
                _coerce(f"{where} key", key_kind, k): _coerce(f"{where}[{k!r}]", item, v)
                for k, v in value.items()
            }
    elif origin in (typing.Union, types.UnionType):
        for option in typing.get_args(kind):
            if option is type(None) and value is None:
                return None
        return _coerce(where, next(a for a in typing.get_args(kind) if a is not type(None)), value)
    else:  # pragma: no cover - a field type this loader does not know is a bug here
        raise TypeError(f"unsupported config type {kind} for {where}")
    name = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{where} must be a {name}, not {value!r}")


def _section(cls: type[T], where: str, data: dict[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown key {where}.{key}: {_nearest(key, names)}")
        values[key] = _coerce(f"{where}.{key}", hints[key], value)
    return cls(**values)


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set takes section.key=value, not {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    return key.strip().split("."), value


def build_config(data: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """A checked config from parsed TOML and ``section.key=value`` overrides."""
    merged: dict[str, dict[str, Any]] = {}
    sections = [f.name for f in dataclasses.fields(TrainConfig)]
    for name, body in data.items():
        if name not in sections:
            raise ConfigError(f"unknown section [{name}]: {_nearest(name, sections)}")
        if not isinstance(body, dict):
            raise ConfigError(f"[{name}] must be a table of keys")
        merged[name] = dict(body)
    for text in overrides:
        path, value = _parse_override(text)
        if len(path) != 2:
            raise ConfigError(f"--set takes section.key=value, not {text!r}")
        if path[0] not in sections:
            raise ConfigError(
                f"unknown section {path[0]!r} in --set: {_nearest(path[0], sections)}"
            )
        merged.setdefault(path[0], {})[path[1]] = value
    hints = typing.get_type_hints(TrainConfig)
    cfg = TrainConfig(**{name: _section(hints[name], name, body) for name, body in merged.items()})
    cfg.check()
    return cfg


def load_config(path: Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read ``path`` (None: the defaults) and apply ``overrides``. Every path field comes back
    absolute: a relative one written in the file against the file's directory, one given by an
    override or left at its default against the working directory."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read the config {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
        _absolute_in_file(data, path.absolute().parent)
    return _absolute(build_config(data, overrides), Path.cwd())


def _path_fields() -> Iterator[tuple[str, str]]:
    hints = typing.get_type_hints(TrainConfig)
    for section in dataclasses.fields(TrainConfig):
        for f in dataclasses.fields(hints[section.name]):
            if f.metadata.get("path"):
                yield section.name, f.name


def _absolute_path(value: str, base: Path) -> str:
    return value if value in BUILT else absolute_location(value, base)


def _absolute_in_file(data: dict[str, Any], base: Path) -> None:
    for section, name in _path_fields():
        body = data.get(section)
        if isinstance(body, dict) and isinstance(body.get(name), str):
            body[name] = _absolute_path(body[name], base)


def _absolute(cfg: TrainConfig, base: Path) -> TrainConfig:
    for section, name in _path_fields():
        part = getattr(cfg, section)
        setattr(part, name, _absolute_path(getattr(part, name), base))
    return cfg


def describe() -> str:
    """Every field with its default and description, as commented TOML."""
    lines: list[str] = []
    hints = typing.get_type_hints(TrainConfig)
    for section in dataclasses.fields(TrainConfig):
        lines.append(f"[{section.name}]")
        cls = hints[section.name]
        for f in dataclasses.fields(cls):
            factory: Any = f.default_factory
            default = f.default if f.default is not dataclasses.MISSING else factory()
            lines.append(f"{f.name} = {toml_value(default)}  # {f.metadata.get('doc', '')}")
        lines.append("")
    return "\n".join(lines)


def to_toml(cfg: TrainConfig) -> str:
    """The resolved config as TOML (written to the run directory)."""
    lines: list[str] = []
    for section in dataclasses.fields(cfg):
        lines.append(f"[{section.name}]")
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value = getattr(getattr(cfg, section.name), f.name)
            lines.append(f"{f.name} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):  # JSON's string escapes are TOML's (and DEL must be escaped too)
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table; keys quoted (patterns hold '*' and ':')
        items = (f"{toml_value(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return repr(value)
