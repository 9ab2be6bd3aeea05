"""The output formats of ``openforge query`` (apart from ``output.py``, so that the command line
can offer them without importing DuckDB)."""

from __future__ import annotations

from enum import StrEnum


class OutputFormat(StrEnum):
    TABLE = "table"  # a rich table, at most ``max_rows`` rows
    CSV = "csv"  # a header line, then one line per row
    JSON = "json"  # JSON Lines: one object per row
    PARQUET = "parquet"  # one Parquet file; needs --out
