"""A documented view of ``openforge query`` (:class:`View`) and the SQL pieces the views share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class View:
    """A view: its name, what one row is, its SELECT, and every column's meaning, in order."""

    name: str
    description: str
    sql: str
    columns: tuple[tuple[str, str], ...]


def unique(relation: str, key: str, order: str = "date") -> str:
    """``relation`` with one row per ``key`` (the first in ``order``)."""
    return (
        f"(SELECT * FROM {relation} "
        f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY {order}) = 1)"
    )


# The step records that count: of the records of one step, the latest; and none that a record
# of an earlier or the same step written after it superseded (a resumed trainer redoes the
# updates after its checkpoint, so what came after them in the first launch never happened).
STEP_RECORDS = """(
    SELECT * FROM raw.step r
    WHERE NOT EXISTS (SELECT 1 FROM raw.step q WHERE q.step <= r.step AND q.at_us > r.at_us)
    QUALIFY row_number() OVER (PARTITION BY step ORDER BY at_us DESC) = 1
)"""
