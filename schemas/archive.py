"""The Parquet archive: records partitioned by type and date, for replay and SQL audits.

Layout (Hive-style, so DuckDB, Spark and pyarrow.dataset read the partitions as columns)::

    ROOT/record=completion/date=2026-11-30/part-<first time us>-<random>.parquet

Each file carries its schema version in the Arrow metadata; :func:`read_archive` decodes every
file by field name, so an archive written by older versions stays readable.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.codec import R, Record, decode_batch, encode_batch, record_type
from schemas.errors import SchemaError


def partition_date(time_us: int) -> str:
    """The UTC date (YYYY-MM-DD) of an instant in microseconds since the epoch."""
    return dt.datetime.fromtimestamp(time_us / 1e6, tz=dt.UTC).date().isoformat()


class ArchiveWriter:
    """Appends records to the archive under ``root``; each :meth:`write` adds files, never edits.

    A file appears whole or not at all (written aside, then renamed). With ``durable``, every
    file and its directory entry are also on disk (fsync) when :meth:`write` returns, so a
    power loss after it loses nothing.
    """

    def __init__(
        self,
        root: Path,
        compression: str = "zstd",
        row_group_size: int = 8192,
        durable: bool = False,
    ) -> None:
        self.root = Path(root)
        self.compression = compression
        self.row_group_size = row_group_size
        self.durable = durable

    def write(self, records: Sequence[Record]) -> list[Path]:
        """Write records (of any types); returns the files written, one per type and date."""
        groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
        for record in records:
            rtype = record_type(record)
            groups[(rtype.name, partition_date(rtype.time_us(record)))].append(record)
        written = []
        for (name, date), group in sorted(groups.items()):
            directory = self.root / f"record={name}" / f"date={date}"
            directory.mkdir(parents=True, exist_ok=True)
            first = min(record_type(r).time_us(r) for r in group)
            path = directory / f"part-{first:016d}-{uuid.uuid4().hex[:8]}.parquet"
            table = pa.Table.from_batches([encode_batch(group)])  # type: ignore[type-var]
            tmp = path.with_suffix(".parquet.tmp")
            pq.write_table(
                table, tmp, compression=self.compression, row_group_size=self.row_group_size
            )
            if self.durable:
                _fsync(tmp)
            tmp.rename(path)  # readers never see a half-written file
            if self.durable:
                _fsync(directory)
            written.append(path)
        return written


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def archive_files(root: Path, name: str, dates: Iterable[str] | None = None) -> list[Path]:
    """The archive's files of record type ``name`` (optionally only some dates), in time order."""
    base = Path(root) / f"record={name}"
    wanted = set(dates) if dates is not None else None
    files = [
        p
        for p in base.glob("date=*/part-*.parquet")
        if wanted is None or p.parent.name.removeprefix("date=") in wanted
    ]
    return sorted(files, key=lambda p: (p.parent.name, p.name))


def read_archive(
    root: Path, cls: type[R], dates: Iterable[str] | None = None, batch_size: int = 4096
) -> Iterator[R]:
    """Every record of type ``cls`` in the archive, file by file in time order."""
    rtype = record_type(cls)
    for path in archive_files(root, rtype.name, dates):
        try:
            parquet = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SchemaError(f"{path} is not a readable Parquet file: {exc}") from exc
        metadata = parquet.schema_arrow.metadata
        for batch in parquet.iter_batches(batch_size=batch_size):
            # iter_batches drops the schema metadata that carries the version; put it back.
            yield from decode_batch(cls, batch.replace_schema_metadata(metadata))
