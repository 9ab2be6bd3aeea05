"""Where a query's data lies: the Parquet archives of a run and its trainer's directory.

A query reads any of:

- an archive root in the layout of :mod:`schemas.archive` (``ROOT/record=NAME/date=.../``);
- a run directory: ``archive/`` (an archive root: what ``openforge train`` keeps, its events,
  episodes, dead letters and step lineage), the episode archives of runs from before it
  (``episodes/episodes/`` and ``episodes/deadletter/``) and ``trainer/`` (``consumed.jsonl``,
  ``metrics.csv``: the lineage of runs without step records). Each part may be missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.archive import archive_files
from schemas.errors import ConfigError

# Archive roots inside a run directory, in the order their files are read.
RUN_ARCHIVES = ("archive", "episodes/episodes", "episodes/deadletter")


def is_archive_root(path: Path) -> bool:
    """Whether ``path`` holds at least one ``record=NAME`` directory."""
    return path.is_dir() and any(p.is_dir() for p in path.glob("record=*"))


@dataclass(frozen=True)
class RunFiles:
    """The archive roots and the trainer directory a query reads (none: every view is empty)."""

    archives: tuple[Path, ...] = ()
    trainer: Path | None = None

    @classmethod
    def of_archive(cls, path: Path) -> RunFiles:
        """An archive root, or a run directory that contains ``archive/``."""
        path = Path(path)
        if is_archive_root(path):
            return cls(archives=(path,))
        if (path / "archive").is_dir():
            return cls.of_run(path)
        if not path.is_dir():
            raise ConfigError(f"--archive {path}: no such directory; pass an archive root")
        raise ConfigError(
            f"--archive {path} is not an archive: it has no record=NAME/ directories (nor an "
            "archive/ directory). Pass the directory that holds record=completion/, ... or use "
            "--run RUN_DIR for a run directory."
        )

    @classmethod
    def of_run(cls, path: Path) -> RunFiles:
        """A run directory: its archives and its trainer directory, where they exist."""
        path = Path(path)
        if not path.is_dir():
            raise ConfigError(f"--run {path}: no such directory; pass a run directory")
        archives = tuple(path / sub for sub in RUN_ARCHIVES if is_archive_root(path / sub))
        trainer = path / "trainer" if (path / "trainer").is_dir() else None
        if not archives and trainer is None:
            expected = ", ".join(f"{sub}/" for sub in (*RUN_ARCHIVES, "trainer"))
            raise ConfigError(
                f"--run {path} is not a run directory: it has none of {expected}. "
                "Pass the run's output directory, or --archive ROOT for a bare archive."
            )
        return cls(archives=archives, trainer=trainer)

    def patterns(self, record: str) -> list[str]:
        """What ``read_parquet`` reads for record type ``record``: per archive that has files of
        it, the glob of its files (expanded at each query, so files written later are read too),
        or, where the archive's path has glob characters itself, its files as they are now."""
        out: list[str] = []
        for root in self.archives:
            files = archive_files(root, record)
            if not files:
                continue  # a glob that matches nothing is an error in DuckDB
            if any(ch in str(root) for ch in "*?[]{}"):
                out += [str(p) for p in files]
            else:
                out.append(str(root / f"record={record}" / "date=*" / "part-*.parquet"))
        return out
