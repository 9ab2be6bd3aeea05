"""Writing a query's result: a rich table, CSV, JSON Lines or Parquet.

CSV and JSON write nested values (lists, structs, maps) as JSON; dates and times as ISO 8601.
Parquet keeps DuckDB's types and needs a file.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import duckdb
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table
from rich.text import Text

from openforge.query.formats import OutputFormat
from openforge.query.views import query_error
from schemas.errors import ConfigError


def plain(value: Any) -> Any:
    """A DuckDB value as a JSON value."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dt.date | dt.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, uuid.UUID | dt.timedelta):
        return str(value)
    return str(value)


def cell(value: Any) -> str:
    """A DuckDB value as one CSV or table cell (null: empty)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(plain(value), ensure_ascii=False)
    result = plain(value)
    return result if isinstance(result, str) else str(result)


def _rows(rel: duckdb.DuckDBPyRelation) -> Iterator[tuple[Any, ...]]:
    """The result's rows; DuckDB's errors while it runs become a ``QueryError``."""
    try:
        yield from rel.iter_rows(batch_size=4096)
    except duckdb.Error as exc:
        raise query_error(exc) from exc


def _table(rel: duckdb.DuckDBPyRelation, stream: TextIO, max_rows: int) -> int:
    table = Table(*rel.columns, header_style="bold")
    shown = 0
    limited = rel.limit(max_rows + 1) if max_rows > 0 else rel
    for row in _rows(limited):
        if 0 < max_rows <= shown:
            table.caption = f"showing the first {max_rows} rows; --max-rows 0 shows all"
            break
        # Text, not markup: a value such as "[/x]" is data.
        table.add_row(*(Text("NULL", style="dim") if v is None else Text(cell(v)) for v in row))
        shown += 1
    if table.caption is None:
        table.caption = f"{shown} row{'s' if shown != 1 else ''}"
    # On a terminal the table fits its width; into a pipe or a file it is as wide as it needs.
    width = None if stream.isatty() else 100_000
    Console(file=stream, width=width).print(table)
    return shown


def _csv(rel: duckdb.DuckDBPyRelation, stream: TextIO) -> int:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(rel.columns)
    count = 0
    for row in _rows(rel):
        writer.writerow(cell(v) for v in row)
        count += 1
    return count


def _json(rel: duckdb.DuckDBPyRelation, stream: TextIO) -> int:
    names = rel.columns
    count = 0
    for row in _rows(rel):
        record = {name: plain(v) for name, v in zip(names, row, strict=True)}
        stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        count += 1
    return count


def _parquet(rel: duckdb.DuckDBPyRelation, out: Path) -> int:
    count = 0
    try:
        reader = rel.to_arrow_reader(batch_size=65536)
        with pq.ParquetWriter(out, reader.schema, compression="zstd") as writer:
            for batch in reader:
                writer.write_batch(batch)
                count += batch.num_rows
    except duckdb.Error as exc:
        raise query_error(exc) from exc
    return count


def write_result(
    rel: duckdb.DuckDBPyRelation,
    fmt: OutputFormat,
    stream: TextIO,
    out: Path | None = None,
    max_rows: int = 100,
) -> int:
    """Write the result of ``rel`` in ``fmt`` to ``out`` (a file, replaced) or else ``stream``;
    returns the rows written (for Parquet, the rows of the result)."""
    if fmt is OutputFormat.PARQUET and out is None:
        raise ConfigError("--format parquet writes a file: add --out FILE.parquet")
    if out is not None:
        try:
            if fmt is OutputFormat.PARQUET:
                return _parquet(rel, out)
            with open(out, "w", newline="") as f:
                return write_result(rel, fmt, f, None, max_rows)
        except OSError as exc:
            raise ConfigError(f"--out {out}: {exc.strerror or exc}; pass a writable file") from exc
    if fmt is OutputFormat.CSV:
        return _csv(rel, stream)
    if fmt is OutputFormat.JSON:
        return _json(rel, stream)
    return _table(rel, stream, max_rows)
