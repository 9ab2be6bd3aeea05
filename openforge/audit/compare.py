"""Runs side by side (``openforge audit --compare RUN_A RUN_B ...``): the same saved queries over
each run, drawn together: reward per step, reward by task, cost per rollout and utilisation.
The harness is a training variable: the same config with another harness is one such pair."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from openforge.audit import charts
from openforge.audit.cost_queries import PHASES
from openforge.audit.fault_recovery import PAIRED, paired
from openforge.audit.queries import Query, Result, last_step
from openforge.audit.recovery import RECOVERY
from openforge.audit.report import Report, Section, open_run, results
from openforge.audit.utilisation import utilisation
from schemas.errors import ConfigError

CHART_NAMES: Sequence[str] = (
    "compare_reward_per_step",
    "compare_reward_by_task",
    "compare_error_recovery",
    "compare_cost_per_rollout",
    "compare_utilisation",
    "compare_fault_recovery",
)


def _query(name: str, title: str, doc: str, of: str) -> Query:
    return Query(name, title, doc, f"-- each run's `{of}` query, with the run's label first")


REWARD = _query(
    "compare_reward",
    "Reward per training step, by run",
    "one row per run and step: the mean reward of the episodes the step consumed",
    "train_reward_per_step",
)
BY_TASK = _query(
    "compare_reward_by_task",
    "Reward by task, by run",
    "one row per run and task: its rewarded rollouts and their mean reward",
    "reward_by_task",
)
RECOVERED = _query(
    "compare_error_recovery",
    "Error recovery, by run",
    "one row per run, harness and policy version: rollouts with a tool error, the errors, the "
    "recovery rate and the mean reward of rollouts with and without an error",
    "error_recovery",
)
COSTS = _query(
    "compare_cost_per_rollout",
    "Cost per rollout, by run (means over its harnesses, weighted by rollouts)",
    "one row per run: its verified rollouts and the mean seconds of each phase",
    "cost_per_rollout",
)
BUSY = _query(
    "compare_utilisation",
    "Busy fractions, by run",
    "one row per run and stage: the fraction of the run's wall time the stage was busy, and "
    "whether it bounded the run",
    "utilisation",
)


def labels(runs: Sequence[Path]) -> list[str]:
    """A short, distinct label per run: its directory's name, with its parent's where two
    share one, and a number where the same run is given again."""
    names = [run.name for run in runs]
    out: list[str] = []
    for run in runs:
        base = f"{run.parent.name}/{run.name}" if names.count(run.name) > 1 else run.name
        label, k = base, 1
        while label in out:
            k += 1
            label = f"{base} ({k})"
        out.append(label)
    return out


def _results(run: Path) -> dict[str, Result]:
    con = open_run(run)
    return results(con, last_step(con))


def _weighted_mean(pairs: Sequence[tuple[float, int]]) -> float | None:
    """The mean of values, each counted ``weight`` times (None: no weight)."""
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def _costs(label: str, costs: Result) -> tuple[object, ...]:
    """One run's mean phases over its harnesses, weighted by their rollouts."""
    counts = [int(c) for c in costs.column("rollouts")]
    means = [
        _weighted_mean([(float(v or 0), k) for v, k in zip(costs.column(p), counts, strict=True)])
        for p in PHASES
    ]
    return (label, sum(counts), *means)


def compare(runs: Sequence[Path]) -> Report:
    """The comparison report of ``runs`` (two or more)."""
    if len(runs) < 2:
        raise ConfigError("--compare needs two runs or more: openforge audit --compare RUN_A RUN_B")
    names = labels(runs)
    by_run = {name: _results(run) for name, run in zip(names, runs, strict=True)}
    reward = Result(
        REWARD,
        ["run", "step", "mean_reward"],
        [(n, s, m) for n, r in by_run.items() for s, m in _rows(r, "train_reward_per_step")],
    )
    by_task = Result(
        BY_TASK,
        ["run", "task_id", "rollouts", "mean_reward"],
        [(n, *row) for n, r in by_run.items() for row in r["reward_by_task"].rows],
    )
    columns = ["harness", "policy_version", "rollouts", "with_errors", "errors",
               "recovery_rate", "reward_with_errors", "reward_without"]  # fmt: skip
    recovered = Result(
        RECOVERED,
        ["run", *columns],
        [
            (n, *(row[r[RECOVERY.name].columns.index(c)] for c in columns))
            for n, r in by_run.items()
            for row in r[RECOVERY.name].rows
        ],
    )
    costs = Result(
        COSTS,
        ["run", "rollouts", *PHASES],
        [_costs(n, r["cost_per_rollout"]) for n, r in by_run.items()],
    )
    busy = Result(
        BUSY,
        ["run", "stage", "busy_fraction", "bounded_the_run"],
        [
            (n, *row)
            for n, r in by_run.items()
            for row in utilisation(r["timeline"], r["step_costs"]).rows
        ],
    )
    counts = {
        f"verified rollouts of {n}": sum(int(c) for c in r["cost_per_rollout"].column("rollouts"))
        for n, r in by_run.items()
    }
    faulted = {n: open_run(r) for n, r in zip(names[1:], runs[1:], strict=True)}
    return Report(
        Path(" vs ".join(names)),
        None,
        counts,
        (
            *_sections(names, reward, by_task, recovered, costs, busy),
            _fault_section(paired(open_run(runs[0]), faulted)),
        ),
    )


def _rows(of_run: dict[str, Result], name: str) -> list[tuple[object, object]]:
    result = of_run[name]
    return list(zip(result.column("step"), result.column("mean_reward"), strict=True))


def _sections(
    names: list[str],
    reward: Result,
    by_task: Result,
    recovered: Result,
    costs: Result,
    busy: Result,
) -> tuple[Section, ...]:
    curves = {
        n: [(float(s), float(m)) for run, s, m in reward.rows if run == n and m is not None]
        for n in names
    }
    tasks = sorted({str(t) for _, t, _, _ in by_task.rows})
    per_task = {
        n: [
            next((m for run, t, _, m in by_task.rows if run == n and t == task), None)
            for task in tasks
        ]
        for n in names
    }
    measures = ["recovery_rate", "reward_with_errors", "reward_without"]
    per_run = {n: [_weighted(recovered, n, m) for m in measures] for n in names}
    phases = {
        str(run): {p.removesuffix("_s"): float(v or 0) for p, v in zip(PHASES, values, strict=True)}
        for run, _, *values in costs.rows
    }
    stages = sorted({str(stage).split(" (")[0] for _, stage, _, _ in busy.rows})
    per_stage = {
        n: [
            next((b for run, s, b, _ in busy.rows if run == n and str(s).startswith(stage)), None)
            for stage in stages
        ]
        for n in names
    }
    return (
        _section(
            REWARD, charts.lines(CHART_NAMES[0], REWARD.title, curves, "training step"), reward
        ),
        _section(BY_TASK, charts.grouped(CHART_NAMES[1], BY_TASK.title, tasks, per_task), by_task),
        _section(
            RECOVERED, charts.grouped(CHART_NAMES[2], RECOVERED.title, measures, per_run), recovered
        ),
        _section(
            COSTS,
            charts.stacked(
                CHART_NAMES[3], COSTS.title, phases, [p.removesuffix("_s") for p in PHASES]
            ),
            costs,
        ),
        _section(BUSY, charts.grouped(CHART_NAMES[4], BUSY.title, stages, per_stage), busy),
    )


def _fault_section(table: Result) -> Section:
    """Paired recovery from injected faults: per faulted run, harness and kind, the recovery
    rate where a fault reached the model beside the one where the harness retried it away."""
    col = table.columns.index
    bars = [f"{row[col('run')]}: {row[col('harness')]} {row[col('kind')]}" for row in table.rows]
    series = {
        name: [row[col(name)] for row in table.rows]
        for name in ("recovery_rate", "absorbed_recovery_rate")
    }
    return _section(PAIRED, charts.grouped(CHART_NAMES[5], PAIRED.title, bars, series), table)


def _section(query: Query, chart: charts.Chart, table: Result) -> Section:
    return Section(query.title, query.doc, chart, (table,))


def _weighted(recovered: Result, run: str, measure: str) -> float | None:
    """``measure`` of ``run`` over its harnesses and versions, weighted by the rollouts it is a
    mean over (those with an error, or for ``reward_without`` those without; None: none)."""
    col = recovered.columns.index
    pairs: list[tuple[float, int]] = []
    for row in recovered.rows:
        erring = int(row[col("with_errors")])
        weight = int(row[col("rollouts")]) - erring if measure == "reward_without" else erring
        if row[0] == run and row[col(measure)] is not None and weight > 0:
            pairs.append((float(row[col(measure)]), weight))
    return _weighted_mean(pairs)
