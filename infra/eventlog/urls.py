"""Where records live, as a URL: an event log or a Parquet archive.

========================================  ==============================================
``kafka://HOST:PORT[,...][?partitions=N]`` an Apache Kafka cluster (its bootstrap servers);
                                          ``partitions``: of the topics OpenForge creates
                                          (default 1; records are keyed by rollout, so a
                                          rollout's records stay in order in one partition)
``local:DIR`` (or ``local://DIR``)        the embedded local log rooted at DIR
``archive:DIR`` (or ``archive://DIR``)    a Parquet archive (read back with ``schemas.archive``)
========================================  ==============================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from schemas.errors import ConfigError

_USAGE = "use kafka://HOST:PORT[,HOST:PORT...][?partitions=N], local:DIR or archive:DIR"
MAX_PARTITIONS = 1024


class LogKind(StrEnum):
    KAFKA = "kafka"
    LOCAL = "local"
    ARCHIVE = "archive"


@dataclass(frozen=True, slots=True)
class LogUrl:
    """A parsed URL. ``where``: the bootstrap servers (``HOST:PORT,HOST:PORT``) or a directory."""

    kind: LogKind
    where: str
    partitions: int = 1  # Kafka: of the topics OpenForge creates

    @property
    def servers(self) -> list[str]:
        """Kafka's bootstrap servers, in the order given."""
        return self.where.split(",") if self.kind is LogKind.KAFKA else []

    @property
    def path(self) -> Path:
        """The directory of a local log or an archive."""
        if self.kind is LogKind.KAFKA:
            raise ConfigError(f"{self} is a Kafka cluster, not a directory")
        return Path(self.where)

    def __str__(self) -> str:
        if self.kind is LogKind.KAFKA:
            query = f"?partitions={self.partitions}" if self.partitions != 1 else ""
            return f"kafka://{self.where}{query}"
        # A directory that itself starts with // needs the explicit form to survive parsing.
        return (
            f"{self.kind}://{self.where}"
            if self.where.startswith("//")
            else f"{self.kind}:{self.where}"
        )


def _server(text: str, url: str) -> str:
    host, colon, port = text.strip().rpartition(":")
    if not colon:
        host, port = port, ""
    if not host or any(c.isspace() or c in "/?#@" for c in host):
        raise ConfigError(f"bad Kafka server {text!r} in {url!r}: {_USAGE}")
    if colon and not (port.isdecimal() and port.isascii() and 0 < int(port) < 65536):
        raise ConfigError(f"bad port in Kafka server {text!r} of {url!r}: use 1..65535")
    return f"{host}:{port}" if colon else host


def _partitions(query: str, url: str) -> int:
    """``partitions=N`` (the only option a Kafka URL takes), 1 without it."""
    if not query:
        return 1
    name, eq, value = query.partition("=")
    if name != "partitions" or not eq or not (value.isdecimal() and value.isascii()):
        raise ConfigError(f"bad option {query!r} in {url!r}: the only one is ?partitions=N")
    if not 1 <= int(value) <= MAX_PARTITIONS:
        raise ConfigError(f"partitions in {url!r} must be from 1 to {MAX_PARTITIONS}")
    return int(value)


def parse_url(url: str) -> LogUrl:
    """``kafka://a:9092,b:9092`` -> (KAFKA, "a:9092,b:9092"); ``local:DIR`` -> (LOCAL, DIR);
    ``archive:DIR`` -> (ARCHIVE, DIR). Raises :class:`ConfigError` for anything else."""
    if url.startswith("kafka://"):
        servers, _, query = url.removeprefix("kafka://").partition("?")
        servers = servers.rstrip("/")
        if servers:
            where = ",".join(_server(s, url) for s in servers.split(","))
            return LogUrl(LogKind.KAFKA, where, _partitions(query, url))
    for kind in (LogKind.LOCAL, LogKind.ARCHIVE):
        if url.startswith(f"{kind}:"):
            path = url.removeprefix(f"{kind}:")
            if path.startswith("//"):
                path = path[2:]
            if path and "\0" not in path:
                return LogUrl(kind, path)
    raise ConfigError(f"unknown event log {url!r}: {_USAGE}")


def absolute_location(text: str, base: Path | None = None) -> str:
    """A location made absolute against ``base`` (default: the working directory):
    ``local:runs/x`` -> ``local:/BASE/runs/x``, ``archive:DIR`` likewise, a plain directory ->
    its absolute path; ``kafka://...`` and other URLs unchanged."""

    def absolute(where: str) -> str:
        path = Path(where).expanduser()
        return os.path.normpath(path if path.is_absolute() else (base or Path.cwd()) / path)

    if text.startswith((f"{LogKind.LOCAL}:", f"{LogKind.ARCHIVE}:")):
        url = parse_url(text)
        return str(LogUrl(url.kind, absolute(url.where)))
    if "://" in text or not text:
        return text
    return absolute(text)
