"""The audit report of a run: the saved queries' results (``queries.py``) grouped into sections,
each with one chart (``charts.py``) and the tables it was drawn from. The terminal
(``terminal.py``) and the HTML page (``html.py``) both render a :class:`Report`."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from infra.image_store import ImageNotFound, ImageStore
from openforge.audit import charts
from openforge.audit.cost_queries import COST_QUERIES, PHASES
from openforge.audit.fault_queries import FAULT_OUTCOMES, FAULT_QUERIES
from openforge.audit.queries import Result, last_step, run_all
from openforge.audit.recovery import OUTCOMES, RECOVERY, recovery
from openforge.audit.utilisation import bounded_by, lanes, utilisation
from openforge.query.source import RunFiles, is_archive_root
from openforge.query.views import connect
from schemas.errors import ConfigError


@dataclass(frozen=True)
class Section:
    """One part of the report: a title, what it shows, its chart and its tables."""

    title: str
    doc: str
    chart: charts.Chart
    tables: tuple[Result, ...]


@dataclass(frozen=True)
class Report:
    """A run's audit: where it was read from, the step whose lineage is shown, the sections."""

    run: Path
    step: int | None
    counts: dict[str, int]
    sections: tuple[Section, ...]


def _pairs(result: Result, x: str, y: str) -> list[tuple[float, float]]:
    return [
        (float(a), float(b))
        for a, b in zip(result.column(x), result.column(y), strict=True)
        if a is not None and b is not None
    ]


def _nested(result: Result, row: str, cls: str, value: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r, c, v in zip(result.column(row), result.column(cls), result.column(value), strict=True):
        out.setdefault(str(r), {})[str(c)] = float(v)
    return out


def _failures(unrewarded: Result, dead: Result) -> charts.Chart:
    counts: Counter[str] = Counter()
    for phase in unrewarded.column("last_phase"):
        counts[f"no reward: {phase}"] += 1
    for reason in dead.column("dead_letter"):
        counts[f"dead letter: {str(reason)[:40]}"] += 1
    labels = sorted(counts)
    return charts.bars(
        "failures",
        "Rollouts without a reward and dead letters",
        labels,
        [counts[k] for k in labels],
    )


def _fault_section(table: Result) -> Section:
    """Each injected fault kind by harness: retried away by the harness, or not."""
    rows = {
        f"{h} {k}": {o: float(n) for o, n in zip(FAULT_OUTCOMES, counts, strict=True)}
        for h, k, *counts in zip(
            *(table.column(c) for c in ("harness", "kind", *FAULT_OUTCOMES)), strict=True
        )
    }
    return Section(
        "Injected faults",
        table.query.doc + " (docs/rollouts.md, Injected faults).",
        charts.stacked("injected_faults", table.query.title, rows, FAULT_OUTCOMES),
        (table,),
    )


def _recovery_section(table: Result) -> Section:
    """What the agent did after each failed tool call, by harness and policy version, beside
    the reward of the rollouts with and without one."""
    rows = {
        f"{h} v{'-' if v is None else v}": {
            o: float(n) for o, n in zip(OUTCOMES, counts, strict=True)
        }
        for h, v, *counts in zip(
            *(table.column(c) for c in ("harness", "policy_version", *OUTCOMES)), strict=True
        )
    }
    rows = {k: v for k, v in rows.items() if sum(v.values())}
    return Section(
        "Error recovery",
        table.query.doc + " (openforge/audit/recovery.py says how an error is recognised).",
        charts.stacked(
            "error_recovery", "After a failed tool call, by harness and version", rows, OUTCOMES
        ),
        (table,),
    )


def _cost_sections(r: dict[str, Result]) -> tuple[Section, ...]:
    """What the rollouts cost, phase by phase, and the run's utilisation and critical path."""
    costs, steps, timeline = r["cost_per_rollout"], r["step_costs"], r["timeline"]
    phases = {
        str(h): {p.removesuffix("_s"): float(v or 0) for p, v in zip(PHASES, row, strict=True)}
        for h, *row in zip(*(costs.column(c) for c in ("harness", *PHASES)), strict=True)
    }
    busy = utilisation(timeline, steps)
    return (
        Section(
            "Cost per rollout",
            costs.query.doc,
            charts.stacked(
                "cost_per_rollout",
                "Mean seconds per rollout, by phase and harness",
                phases,
                [p.removesuffix("_s") for p in PHASES],
            ),
            (costs,),
        ),
        Section(
            "Utilisation and the critical path",
            f"{busy.query.doc}. This run: {bounded_by(busy)}. The timeline shows each rollout "
            "in its sandbox slot, each update and weight sync on the trainer's row.",
            charts.timeline("timeline", timeline.query.title, lanes(timeline)),
            (busy, steps, timeline),
        ),
    )


def _bars(name: str, result: Result, label: str, value: str, prefix: str = "") -> charts.Chart:
    labels = [f"{prefix}{v}" for v in result.column(label)]
    return charts.bars(name, result.query.title, labels, result.column(value))


def _bar_section(title: str, result: Result, name: str, label: str, prefix: str = "") -> Section:
    """A section of one bar chart of ``result``'s ``label`` column against its mean reward."""
    return Section(
        title, result.query.doc, _bars(name, result, label, "mean_reward", prefix), (result,)
    )


def _reward_sections(r: dict[str, Result]) -> tuple[Section, ...]:
    """Reward per step (train and held-out), by task, by harness and by policy version."""
    train, heldout = r["train_reward_per_step"], r["heldout_reward_per_version"]
    reward_curve = charts.lines(
        "reward_per_step",
        "Reward per step (train) and per policy version (held-out)",
        {"train": _pairs(train, "step", "mean_reward"),
         "held-out": _pairs(heldout, "policy_version", "mean_reward")},
        "training step / policy version",
    )  # fmt: skip
    return (
        Section(
            "Reward per step",
            "Mean reward of the episodes each update consumed, and of the held-out rollouts of "
            "each evaluated policy version.",
            reward_curve,
            (train, heldout),
        ),
        _bar_section("Reward by task", r["reward_by_task"], "reward_by_task", "task_id"),
        _bar_section("Reward by harness", r["reward_by_harness"], "reward_by_harness", "harness"),
        _bar_section(
            "Reward by policy version",
            r["reward_by_policy_version"],
            "reward_by_policy_version",
            "policy_version",
            "v",
        ),
    )


def _stacked_section(title: str, result: Result, row: str, cls: str, value: str) -> Section:
    """A section of one stacked chart of ``result``: ``value`` per ``row``, split by ``cls``."""
    name = result.query.name
    chart = charts.stacked(name, title, _nested(result, row, cls, value))
    return Section(title, result.query.doc, chart, (result,))


def _call_sections(r: dict[str, Result]) -> tuple[Section, ...]:
    """How the calls went: continuity and fork classes, staleness, importance weights,
    latency per dialect, tool-call usage and actions per rollout."""
    is_w, lat, tools = r["is_weights_per_step"], r["latency_by_dialect"], r["tool_calls"]
    is_chart = charts.lines(
        "is_weights",
        is_w.query.title,
        {k: _pairs(is_w, "step", f"is_{k}") for k in ("min", "mean", "max")},
        "training step",
    )
    latency = charts.grouped(
        "latency_by_dialect",
        lat.query.title,
        [str(d) for d in lat.column("dialect")],
        {p: lat.column(p) for p in ("p50", "p90", "p99")},
    )
    tool_chart = charts.stacked(
        "tool_calls", tools.query.title, _nested(tools, "tool", "harness", "calls")
    )
    return (
        _stacked_section("Continuity classes per harness", r["continuity_by_harness"],
                         "harness", "continuity", "calls"),
        _stacked_section("Fork classes per harness", r["fork_classes_by_harness"],
                         "harness", "mismatch", "forks"),
        Section("Staleness", r["staleness"].query.doc,
                _bars("staleness", r["staleness"], "lag", "episodes", "lag "), (r["staleness"],)),
        Section("Importance-sampling weights", is_w.query.doc, is_chart, (is_w,)),
        Section("Latency per dialect", lat.query.doc, latency, (lat,)),
        Section("Tool-call usage", tools.query.doc, tool_chart, (tools,)),
        _stacked_section("Actions per rollout", r["actions_per_rollout"],
                         "actions", "harness", "rollouts"),
    )  # fmt: skip


def _screenshot_section(result: Result, rollout: str | None, images: ImageStore | None) -> Section:
    """The screenshots of one rollout's steps (``rollout``, else the one with the most), each
    with the actions the model answered; the images from the proxy's image store."""
    steps: dict[str, list[tuple[Any, ...]]] = {}
    for row in result.rows:
        steps.setdefault(str(row[0]), []).append(row)
    if rollout is not None and rollout not in steps:
        shown = ", ".join(sorted(steps)[:5]) or "none"
        raise ConfigError(
            f"--rollout {rollout}: no call of that rollout showed an image (rollouts with "
            f"screenshots: {shown}); pass one of them"
        )
    chosen = rollout or max(sorted(steps), key=lambda r: len(steps[r]), default=None)
    items = []
    for row in steps.get(chosen or "", []):
        call, sha, actions = row[3], str(row[4]), row[6]
        items.append((f"call {call}: {actions or 'no action recorded'}", _data_url(images, sha)))
    title = f"Screenshots of rollout {chosen}" if chosen else result.query.title
    doc = result.query.doc + (
        "" if images is not None else ". No image store was found (pass --image-dir)"
    )
    return Section(title, doc, charts.gallery("screenshots", title, items), (result,))


def _data_url(images: ImageStore | None, sha: str) -> str | None:
    if images is None:
        return None
    try:
        data, media_type = images.get(sha)
    except ImageNotFound:
        return None
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _promotion_section(table: Result) -> Section:
    """The promotion gate's checks: the candidate's and the served policy's scores per step."""
    chart = charts.lines(
        "promotions",
        table.query.title,
        {k: _pairs(table, "step", f"{k}_score") for k in ("candidate", "served")},
        "training step",
    )
    return Section("Safe promotion", table.query.doc, chart, (table,))


def _lineage_sections(r: dict[str, Result], step: int | None) -> tuple[Section, ...]:
    """What never made it into training, and the lineage of step ``step``."""
    lineage = r["step_lineage"]
    rows = [
        (str(t), str(ro), str(h), rew)
        for t, ro, h, rew in zip(
            *(lineage.column(c) for c in ("task_id", "rollout_id", "harness", "reward")),
            strict=True,
        )
    ]
    return (
        Section("Rollouts without a reward and dead letters",
                "Rollouts that never got a reward (by their last phase) and episodes the "
                "pipeline could not make trainable (by reason).",
                _failures(r["rollouts_without_reward"], r["dead_letters"]),
                (r["rollouts_without_reward"], r["dead_letters"])),
        Section(f"Lineage of step {'-' if step is None else step}", lineage.query.doc,
                charts.lineage("step_lineage", "Lineage of a training step", step, rows),
                (lineage,)),
    )  # fmt: skip


def sections(
    results: dict[str, Result],
    step: int | None,
    rollout: str | None = None,
    images: ImageStore | None = None,
) -> tuple[Section, ...]:
    """The report's sections, in page order, from every saved query's result (``rollout``:
    whose screenshots are shown; ``images``: where their bytes are)."""
    return (
        *_reward_sections(results),
        _recovery_section(results["error_recovery"]),
        _fault_section(results["injected_faults"]),
        *_call_sections(results),
        _screenshot_section(results["screenshots"], rollout, images),
        _promotion_section(results["promotions"]),
        *_lineage_sections(results, step),
        *_cost_sections(results),
    )


CHART_NAMES: Sequence[str] = (
    "reward_per_step", "reward_by_task", "reward_by_harness", "reward_by_policy_version",
    "error_recovery", "injected_faults",
    "continuity_by_harness", "fork_classes_by_harness", "staleness", "is_weights",
    "latency_by_dialect", "tool_calls", "actions_per_rollout", "screenshots", "promotions",
    "failures",
    "step_lineage", "cost_per_rollout", "timeline",
)  # fmt: skip
"""Every chart of the page, in order (each appears once, drawn or "no data")."""


def _counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The run's counts, each named for what it counts (the views have one row per event:
    ``rollouts`` holds every lifecycle event, several per rollout)."""
    sql = """
        SELECT 'rollouts', count(DISTINCT rollout_id) FROM rollouts
        UNION ALL SELECT 'lifecycle events', count(*) FROM rollouts
        UNION ALL SELECT 'calls', count(*) FROM completions
        UNION ALL SELECT 'rewards', count(*) FROM rewards
        UNION ALL SELECT 'episodes', count(*) FROM episodes
        UNION ALL SELECT 'training steps', count(DISTINCT step) FROM steps
    """
    return {str(k): int(v) for k, v in con.sql(sql).fetchall()}


def results(con: duckdb.DuckDBPyConnection, step: int | None) -> dict[str, Result]:
    """Every result the report's sections draw, by name (``step``: the lineage shown)."""
    out = run_all(con, step, (*COST_QUERIES, *FAULT_QUERIES))
    out[RECOVERY.name] = recovery(con)
    return out


def open_run(run: Path) -> duckdb.DuckDBPyConnection:
    """The views over a run directory, or an archive root."""
    return connect(RunFiles.of_archive(run) if is_archive_root(run) else RunFiles.of_run(run))


def image_store(run: Path, image_dir: Path | None = None) -> ImageStore | None:
    """The images of a run's calls: ``image_dir``, else the run's embedded log's ``images``
    (where ``openforge train``'s proxy stores them); None if there is none."""
    if image_dir is not None:
        return ImageStore(image_dir)
    default = run / "log" / "images"
    return ImageStore(default) if default.is_dir() else None


def build(
    run: Path, step: int | None = None, rollout: str | None = None, image_dir: Path | None = None
) -> Report:
    """The audit of the run directory (or archive root) ``run``; ``step``: the step whose lineage
    is shown (default: the last); ``rollout``: whose screenshots are shown (default: the one
    with the most); ``image_dir``: the proxy's image store (default: the run's)."""
    con = open_run(run)
    last = last_step(con)
    if step is not None and (last is None or not 1 <= step <= last):
        raise ConfigError(
            f"--step {step}: the run has "
            + ("no training steps" if last is None else f"steps 1 to {last}")
            + "; pass one of them, or leave --step out for the last"
        )
    chosen = step if step is not None else last
    images = image_store(run, image_dir)
    found = sections(results(con, chosen), chosen, rollout, images)
    return Report(run, chosen, _counts(con), found)
