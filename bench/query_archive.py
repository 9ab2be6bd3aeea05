"""Query times of ``openforge query`` over an archive of a million generated tokens.

    .venv/bin/python -m bench.query_archive [--tokens 1000000] [--repeat 3]

Builds an archive in the layout a run keeps (``schemas.archive``): synthetic multi-turn rollouts
(``openforge.testing.rollouts``: forks, retries, side calls, duplicate deliveries) until their
completion events hold ``--tokens`` generated tokens (each event counted once: rows of the
``tokens`` view), their rollout and reward events, and the
episodes the pipeline's assembly core makes of them, written in batches of 500 rollouts (one
file per record type and batch, as the streaming job writes them per bundle). Then times, on
one DuckDB connection (``openforge.query.views.connect``, the path ``openforge query`` takes),
a count of every view and the audit's saved queries (``openforge.audit.queries``).

Baseline, side by side: the same answers computed with pyarrow alone over the same files
(``pyarrow.dataset``, ``pyarrow.compute``): generated tokens per policy version (the ``tokens``
view), completions per continuity class, and mean reward per task. Each pair must agree, and
DuckDB's plan must read the archive's Parquet files (``READ_PARQUET`` / ``PARQUET_SCAN``), so
a figure cannot come from another path.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from openforge.audit.queries import QUERIES, run
from openforge.query.catalog import VIEWS
from openforge.query.source import RunFiles
from openforge.query.views import connect
from openforge.testing.rollouts import make_rollout
from pipeline.assembly import assemble
from schemas.archive import ArchiveWriter
from schemas.codec import Record
from schemas.completion import CompletionEvent

BATCH = 500  # rollouts per write: one file per record type, like one bundle of the stream


def build(root: Path, tokens: int) -> dict[str, int]:
    writer = ArchiveWriter(root)
    counts = {"rollouts": 0, "completion events": 0, "generated tokens": 0, "files": 0}
    seed = 0
    while counts["generated tokens"] < tokens:
        records: list[Record] = []
        for _ in range(BATCH):
            rollout = make_rollout(seed, f"r{seed:06d}", calls=10)
            seed += 1
            records += rollout.records
            records.append(assemble(rollout.rollout_id, rollout.records, created_us=seed))
            done = {r.event_id: r for r in rollout.records if isinstance(r, CompletionEvent)}
            counts["completion events"] += len(done)  # once each: deliveries repeat some
            counts["generated tokens"] += sum(len(e.completion_token_ids) for e in done.values())
        counts["rollouts"] += BATCH
        counts["files"] += len(writer.write(records))
    return counts


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def _arrow_tokens_per_version(root: Path) -> dict[int, int]:
    """Generated tokens per policy version, deduplicated by event id: pyarrow, and a Python set
    for the first row of each event id."""
    table = ds.dataset(root / "record=completion", format="parquet", partitioning="hive").to_table(
        columns=["event_id", "policy_versions"]
    )
    ids = table["event_id"].to_pylist()
    seen: set[str] = set()
    keep = []
    for i, e in enumerate(ids):
        if e not in seen:
            seen.add(e)
            keep.append(i)
    spans = table.take(pa.array(keep))["policy_versions"].combine_chunks()
    flat = pc.list_flatten(spans)
    version = flat.field("version").to_pylist()
    n = pc.subtract(flat.field("end"), flat.field("start")).to_pylist()
    out: dict[int, int] = {}
    for v, k in zip(version, n, strict=True):
        out[v] = out.get(v, 0) + k
    return out


def _arrow_continuity(root: Path) -> dict[str, int]:
    table = ds.dataset(root / "record=completion", format="parquet", partitioning="hive").to_table(
        columns=["event_id", "continuity"]
    )
    unique = table.group_by(["event_id", "continuity"]).aggregate([])
    counted = unique.group_by("continuity").aggregate([("event_id", "count")])
    return dict(
        zip(counted["continuity"].to_pylist(), counted["event_id_count"].to_pylist(), strict=True)
    )


def _arrow_reward_by_task(root: Path) -> dict[str, float]:
    table = ds.dataset(root / "record=episode", format="parquet", partitioning="hive").to_table(
        columns=["episode_id", "task_id", "reward"]
    )
    unique = table.group_by(["episode_id", "task_id", "reward"]).aggregate([])
    mean = unique.group_by("task_id").aggregate([("reward", "mean")])
    return dict(zip(mean["task_id"].to_pylist(), mean["reward_mean"].to_pylist(), strict=True))


PAIRS: list[tuple[str, str, Callable[[Path], Any]]] = [
    (
        "generated tokens per policy version",
        "SELECT policy_version, count(*) FROM tokens GROUP BY ALL",
        _arrow_tokens_per_version,
    ),
    (
        "completions per continuity class",
        "SELECT continuity, count(*) FROM completions GROUP BY ALL",
        _arrow_continuity,
    ),
    (
        "mean reward per task",
        "SELECT task_id, avg(reward) FROM episodes GROUP BY ALL",
        _arrow_reward_by_task,
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the best counts")
    parser.add_argument("--keep", type=Path, help="build the archive here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="openforge-query-bench-"))
    try:
        t0 = time.perf_counter()
        counts = build(root, args.tokens)
        built = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        print(
            f"archive: {counts['rollouts']:,} rollouts, {counts['completion events']:,} "
            f"completion events, {counts['generated tokens']:,} generated tokens, "
            f"{counts['files']} files, {size / 1e6:.1f} MB; built in {built:.1f} s\n"
        )
        con = connect(RunFiles.of_archive(root))
        plan = "\n".join(
            str(r[-1]) for r in con.sql("EXPLAIN SELECT count(*) FROM tokens").fetchall()
        )
        assert "READ_PARQUET" in plan.upper() or "PARQUET_SCAN" in plan.upper(), plan

        print(f"| view | rows | count(*) s (best of {args.repeat}) |")
        print("|---|---|---|")

        def fetch(sql: str) -> list[Any]:
            return list(con.execute(sql).fetchall())

        for view in VIEWS:
            secs, rows = _best(partial(fetch, f"SELECT count(*) FROM {view.name}"), args.repeat)
            print(f"| `{view.name}` | {rows[0][0]:,} | {secs:.3f} |")

        print("\n| audit query | rows | s |")
        print("|---|---|---|")
        for query in QUERIES:
            secs, result = _best(partial(run, con, query, None), args.repeat)
            print(f"| `{query.name}` | {len(result.rows)} | {secs:.3f} |")

        print("\n| question | DuckDB view s | pyarrow alone s | ratio | same answer |")
        print("|---|---|---|---|---|")
        for name, sql, baseline in PAIRS:
            d_secs, d_rows = _best(partial(fetch, sql), args.repeat)
            b_secs, b_out = _best(partial(baseline, root), args.repeat)
            mine = {k: v for k, v in d_rows}
            same = set(mine) == set(b_out) and all(
                abs(float(mine[k]) - float(b_out[k])) < 1e-9 for k in mine
            )
            assert same, (name, mine, b_out)
            print(f"| {name} | {d_secs:.3f} | {b_secs:.3f} | {b_secs / d_secs:.1f}x | yes |")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
