"""A DuckDB connection with the documented views over a run's archive (``catalog.py``).

The raw records of each type are the view ``raw.<record>`` (every field, duplicates included):
the archive's Parquet files read with ``read_parquet(..., hive_partitioning=true,
union_by_name=true)``, united by name with an empty table of the record's current Arrow schema.
So a record type without files yet still has its view with the right columns, and files written
by older schema versions show the fields they lack as null. DuckDB expands the archives' globs
at each query, so a connection also reads files written after it was opened (of a record type
that had files then).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from openforge.query.catalog import VIEWS
from openforge.query.lineage import steps_table
from openforge.query.source import RunFiles
from openforge.query.view import View
from schemas.codec import REGISTRY
from schemas.errors import ConfigError, QueryError

# The hive partition columns of the archive layout (ROOT/record=NAME/date=YYYY-MM-DD/).
_PARTITIONS = [pa.field("record", pa.string()), pa.field("date", pa.date32())]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _raw_view(con: duckdb.DuckDBPyConnection, name: str, patterns: list[str]) -> None:
    """``raw.<name>``: the record type's files, or nothing, with every current column."""
    schema = REGISTRY[name].schema
    empty = pa.schema([*schema, *_PARTITIONS]).empty_table()
    con.register("_empty", empty)
    con.execute(f"CREATE TABLE raw._empty_{name} AS SELECT * FROM _empty")
    con.unregister("_empty")
    sql = f"SELECT * FROM raw._empty_{name}"
    if patterns:
        listed = ", ".join(_quote(p) for p in patterns)
        sql += (
            f" UNION ALL BY NAME SELECT * FROM read_parquet([{listed}], "
            "hive_partitioning = true, union_by_name = true)"
        )
    con.execute(f"CREATE VIEW raw.{name} AS {sql}")


def _documented_view(con: duckdb.DuckDBPyConnection, view: View) -> None:
    con.execute(f"CREATE VIEW {view.name} AS {view.sql}")
    con.execute(f"COMMENT ON VIEW {view.name} IS {_quote(view.description)}")
    for column, doc in view.columns:
        con.execute(f"COMMENT ON COLUMN {view.name}.{column} IS {_quote(doc)}")


def connect(files: RunFiles) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with ``raw.<record>`` and the documented views over
    ``files`` (:data:`openforge.query.catalog.VIEWS`)."""
    con = duckdb.connect(":memory:")
    con.execute("CREATE SCHEMA raw")
    for name in REGISTRY:
        _raw_view(con, name, files.patterns(name))
    con.register("_steps", steps_table(files.trainer))
    con.execute("CREATE TABLE raw.consumed AS SELECT * FROM _steps")
    con.unregister("_steps")
    for view in VIEWS:
        _documented_view(con, view)
    return con


def open_views(path: Path | None = None, *, run: Path | None = None) -> duckdb.DuckDBPyConnection:
    """The views over an archive root or a run directory containing ``archive/`` (``path``), or
    over a run directory (``run``); with neither, over nothing (every view empty)."""
    if path is not None and run is not None:
        raise ConfigError("pass either an archive (--archive) or a run directory (--run), not both")
    if path is not None:
        return connect(RunFiles.of_archive(path))
    if run is not None:
        return connect(RunFiles.of_run(run))
    return connect(RunFiles())


def view_list() -> str:
    """One line per view: its name and what one row is."""
    width = max(len(v.name) for v in VIEWS)
    return "\n".join(f"  {v.name:<{width}}  {v.description}" for v in VIEWS)


def describe(con: duckdb.DuckDBPyConnection) -> str:
    """Every view with what one row is, then its columns: name, type and meaning."""
    rows = con.sql(
        "SELECT table_name, column_name, data_type, comment FROM duckdb_columns() "
        "WHERE schema_name = 'main' ORDER BY column_index"
    ).fetchall()
    columns: dict[str, list[tuple[str, str, str]]] = {}
    for table, column, dtype, comment in rows:
        columns.setdefault(table, []).append((column, dtype, comment or ""))
    lines = []
    for view in VIEWS:
        lines.append(f"{view.name}: {view.description}")
        cols = columns[view.name]
        name_w = max(len(c[0]) for c in cols)
        type_w = max(len(c[1]) for c in cols)
        lines += [f"  {c:<{name_w}}  {t:<{type_w}}  {doc}" for c, t, doc in cols]
        lines.append("")
    lines.append(
        "raw.completion, raw.rollout, raw.reward, raw.episode, raw.step: every field of the "
        "records as stored (duplicate deliveries included); raw.consumed: the trainer's "
        "consumed.jsonl (steps reads it for runs without step records)."
    )
    return "\n".join(lines)


def query_error(exc: Exception) -> QueryError:
    """DuckDB's error as ours: its message, then the list of views."""
    return QueryError(
        f"{exc}\n\nThe views (`openforge query --views` lists their columns):\n{view_list()}"
    )


def execute(con: duckdb.DuckDBPyConnection, sql: str) -> duckdb.DuckDBPyRelation | None:
    """Bind ``sql`` (and run it, if it is not a query); its result, None for a statement
    without one. DuckDB's errors become a :class:`QueryError` (:func:`query_error`)."""
    try:
        return con.sql(sql)
    except duckdb.Error as exc:
        raise query_error(exc) from exc
