"""Records the event log cannot take, kept on disk with the reason instead of lost.

A record that the codec cannot encode (a field of the wrong type, an integer outside its Arrow
type, a string that is not valid unicode) or whose frame is over the log's message limit is
appended to ``dead-letter.jsonl`` in the spool directory, one JSON object a line::

    {"at_us": ..., "reason": "...", "record_type": "RewardEvent", "rollout_id": "...",
     "event_id": "...", "record": {...every field, repr() for what JSON cannot hold...}}

and counted (``PublisherStats.dead_lettered``, ``openforge_proxy_events_dead_lettered``). Each
line is flushed and fsynced before the record counts as handled. Read the file, fix the producer
of the record, and re-send what matters; nothing reads it automatically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from enum import Enum
from pathlib import Path
from typing import Any

from schemas.errors import EventLogUnavailable

FILE_NAME = "dead-letter.jsonl"


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data, whatever it holds (repr() for the rest)."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name, None)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


class DeadLetters:
    """Appends dead letters to ``directory / dead-letter.jsonl`` (created on first use)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE_NAME

    def write(self, record: object, reason: str) -> None:
        """Append one record with ``reason``, durably; EventLogUnavailable if the disk fails."""
        line = {
            "at_us": time.time_ns() // 1000,
            "reason": reason,
            "record_type": type(record).__name__,
            "rollout_id": _plain(getattr(record, "rollout_id", None)),
            "event_id": _plain(getattr(record, "event_id", None)),
            "record": _plain(record),
        }
        # ensure_ascii: a lone surrogate (one reason a record lands here) is written escaped.
        data = (json.dumps(line, ensure_ascii=True) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise EventLogUnavailable(
                f"cannot write the dead-letter file {self.path}: {exc}; free disk space"
            ) from exc

    def read(self) -> list[dict[str, Any]]:
        """Every dead letter so far (for tests and operators)."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
