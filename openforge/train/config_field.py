"""One setting of the ``openforge train`` config: its default and its one-line description."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, doc: str, *, path: bool = False) -> Any:
    """A field with its default and its one-line description; ``path``: its value is a path or
    a location (``local:DIR``), made absolute by :func:`load_config`."""
    metadata = {"doc": doc, "path": path}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)
