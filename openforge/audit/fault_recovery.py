"""Recovery from injected faults, paired (issue 53): the same tasks played clean (the first run
of ``openforge audit --compare``) and with a fault plan (a later run), rollout for rollout.

A faulted rollout pairs with the clean rollout of the same task, sample (the orchestrator's
``sample`` metadata) and policy version. Each fault the proxy injected into its calls
(``completions.fault``) had one of four fates, read from the calls after it:

- **no error**: the call still ended ok (a slow first byte): nothing to recover from;
- **retried by the harness**: a later call is a retry of it (``retry_of``): the harness's own
  retry loop absorbed it, and the model never saw it;
- **reached the model**: the harness went on with other calls instead (a rewritten prompt: the
  model now works from the failure);
- **ended the rollout**: no call came after it: the harness stopped.

A fault injected into the rollout's sandbox (``command_fails_once``, recorded with the rollout's
verified event) hit a command: when the model had asked for it (a tool call whose arguments
hold the command), it **reached the model** (the model saw the failure as the command's
result), or **ended the rollout** if no call came after it; when not, it **hit the harness's own
command** (the harness's start-up or housekeeping: the model never saw it; counted as absorbed).
Its retries are the model's later tool calls of the same command, and its seconds to recover run
from the fault to the first later call that carries a tool result that is not an error.

Per faulted run, harness and fault kind, over the pairs the kind hit: the **recovery rate** (of
the pairs whose clean rollout succeeded, reward > 0, and where a fault of the kind reached the
model: the share whose faulted rollout still succeeded) beside the same rate where the harness
absorbed every fault of the kind (recovery by its own retries), the **retries per fault**, the
**seconds to recover** (from a faulted call to the rollout's next call that ended ok), the
**recovery gap** (the clean rollouts' mean reward minus the faulted ones') and the **false
successes** (faulted rollouts whose clean twin succeeded, whose harness ended as finished with
exit 0, and that got reward 0: it claimed done and was not).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from openforge.audit.queries import Query, Result, run
from openforge.audit.recovery import CALLS, is_error, load_body, tool_calls, tool_results
from schemas.faults import SANDBOX_FAULTS, SandboxFault

FATES = (
    "no error",
    "retried by the harness",
    "reached the model",
    "ended the rollout",
    "hit the harness's own command",
)

FAULT_CALLS = Query(
    "fault_calls",
    "The calls paired fault recovery reads",
    "one row per call (side calls too: a fault can hit any call of the harness): its fault "
    "(null: none), how it ended, when, and the earlier call it retries",
    """
    SELECT rollout_id, event_id, fault, status, received_us, done_us, retry_of
    FROM completions ORDER BY rollout_id, call_index, received_us
    """,
)
SANDBOX = Query(
    "fault_sandbox",
    "The sandbox faults that fired",
    "one row per verified rollout of a run with sandbox faults: the faults that fired in it, "
    "as recorded (JSON: kind, when, the command)",
    f"""
    SELECT rollout_id, arg_max(metadata['{SANDBOX_FAULTS}'], at_us) AS faults
    FROM rollouts WHERE phase = 'verified' AND metadata['{SANDBOX_FAULTS}'] IS NOT NULL
    GROUP BY 1 ORDER BY 1
    """,
)
PAIRABLE = Query(
    "fault_pairable",
    "Each rewarded rollout, with what pairs it",
    "one row per rewarded rollout: its task, harness, sample and newest policy version (what "
    "pairs a faulted rollout with its clean twin), its latest reward and how its harness ended",
    """
    WITH started AS (
        SELECT rollout_id, any_value(task_id) AS task_id,
            any_value(coalesce(harness, '?')) AS harness,
            any_value(metadata['sample']) AS sample, min(at_us) AS at_us
        FROM rollouts WHERE phase = 'started' GROUP BY 1
    ), ended AS (
        SELECT rollout_id, arg_max(phase, at_us) AS agent_end,
            arg_max(exit_code, at_us) AS exit_code
        FROM rollouts WHERE phase IN ('finished', 'failed', 'timed_out') GROUP BY 1
    ), version AS (
        SELECT rollout_id, max(list_max(policy_versions)) AS policy_version
        FROM completions GROUP BY 1
    ), reward AS (
        SELECT rollout_id, arg_max(reward, at_us) AS reward FROM rewards GROUP BY 1
    )
    SELECT s.rollout_id, s.task_id, s.harness, s.sample, v.policy_version, r.reward,
        e.agent_end, e.exit_code
    FROM started s JOIN reward r USING (rollout_id)
        LEFT JOIN ended e USING (rollout_id) LEFT JOIN version v USING (rollout_id)
    ORDER BY s.at_us, s.rollout_id
    """,
)
PAIRED = Query(
    "compare_fault_recovery",
    "Recovery from injected faults, paired with the first run",
    "one row per faulted run, harness and fault kind: the pairs (a faulted rollout and the "
    "clean rollout of the same task, sample and policy version) the kind hit, those whose clean "
    "rollout succeeded, of those the ones where a fault reached the model and the share that "
    "still succeeded (recovery_rate), the ones where the harness retried every fault away (or it "
    "did no harm) and their share (absorbed_recovery_rate), those a fault ended (the harness "
    "stopped), retries per fault, mean seconds to recover, the "
    "recovery gap (clean minus faulted mean reward) and the false successes (of the pairs whose "
    "clean rollout succeeded: finished, exit 0, reward 0)",
    "-- computed in openforge/audit/fault_recovery.py from each run's fault_calls and "
    "fault_pairable queries",
)
COLUMNS = [
    "run", "harness", "kind", "pairs", "clean_succeeded", "reached_model", "recovery_rate",
    "absorbed", "absorbed_recovery_rate", "ended", "retries_per_fault", "recover_s",
    "recovery_gap", "false_successes",
]  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """One injected fault, and what became of it."""

    rollout_id: str
    kind: str
    fate: str  # one of FATES
    retries: int  # later calls that retried it
    recover_s: float | None  # to the rollout's next call that ended ok (None: none did)


@dataclass(frozen=True)
class Played:
    """A rewarded rollout, as the pairing reads it."""

    rollout_id: str
    key: tuple[Any, ...]  # task, harness, sample, policy version
    reward: float
    false_success: bool  # finished with exit 0, and reward 0

    @property
    def succeeded(self) -> bool:
        return self.reward > 0


def faults_of(calls: Sequence[dict[str, Any]]) -> list[Fault]:
    """The faults of one rollout's calls (in order), each with its fate."""
    retries = Counter(str(c["retry_of"]) for c in calls if c["retry_of"])
    out = []
    for i, call in enumerate(calls):
        if not call["fault"]:
            continue
        n = retries[str(call["event_id"])]
        fate = (
            FATES[0] if call["status"] == "ok"
            else FATES[1] if n
            else FATES[2] if i + 1 < len(calls)
            else FATES[3]
        )  # fmt: skip
        ok = next((c for c in calls[i + 1 :] if c["status"] == "ok" and c["done_us"]), None)
        recover = (int(ok["done_us"]) - int(call["received_us"])) / 1e6 if ok else None
        out.append(Fault(str(call["rollout_id"]), str(call["fault"]), fate, n, recover))
    return out


def played(rows: Result) -> list[Played]:
    """The ``fault_pairable`` query's rows, as pairing reads them."""
    out = []
    for row in rows.rows:
        rid, task, harness, sample, version, reward, end, code = row
        finished = end == "finished" and code == 0
        key = (task, harness, sample, version)
        out.append(Played(str(rid), key, float(reward), finished and float(reward) == 0))
    return out


def pair(clean: Iterable[Played], faulted: Iterable[Played]) -> list[tuple[Played, Played]]:
    """Each faulted rollout with a clean one of the same key, first come first paired; one
    whose policy version is unknown (a fault failed all its calls: no tokens) with one of the
    same task, harness and sample at any version; a rollout without a twin is left out."""
    waiting: dict[tuple[Any, ...], list[Played]] = {}
    for p in clean:
        waiting.setdefault(p.key, []).append(p)
    out, unknown = [], []
    for f in faulted:
        if waiting.get(f.key):
            out.append((waiting[f.key].pop(0), f))
        elif f.key[3] is None:
            unknown.append(f)
    for f in unknown:
        twin = next((k for k, ps in waiting.items() if ps and k[:3] == f.key[:3]), None)
        if twin is not None:
            out.append((waiting[twin].pop(0), f))
    return out


def table(
    label: str, pairs: Sequence[tuple[Played, Played]], faults: Sequence[Fault]
) -> list[tuple[Any, ...]]:
    """The paired recovery rows of one faulted run (:data:`COLUMNS`)."""
    by_rollout: dict[str, list[Fault]] = {}
    for fault in faults:
        by_rollout.setdefault(fault.rollout_id, []).append(fault)
    kinds = sorted({(f.key[1], x.kind) for _, f in pairs for x in by_rollout.get(f.rollout_id, [])})
    return [_row(label, harness, kind, pairs, by_rollout) for harness, kind in kinds]


def _row(
    label: str,
    harness: str,
    kind: str,
    pairs: Sequence[tuple[Played, Played]],
    by_rollout: dict[str, list[Fault]],
) -> tuple[Any, ...]:
    hit = [
        (c, f, [x for x in by_rollout.get(f.rollout_id, []) if x.kind == kind])
        for c, f in pairs
        if f.key[1] == harness
    ]
    hit = [(c, f, fs) for c, f, fs in hit if fs]
    ok = [(c, f, fs) for c, f, fs in hit if c.succeeded]
    by_outcome: dict[str, list[Played]] = {fate: [] for fate in FATES[1:]}
    for _, f, fs in ok:
        by_outcome[_outcome({x.fate for x in fs})].append(f)
    ended, reached = by_outcome[FATES[3]], by_outcome[FATES[2]]
    absorbed = by_outcome[FATES[1]]
    faults = [x for _, _, fs in hit for x in fs]
    times = [x.recover_s for x in faults if x.recover_s is not None]
    return (
        label, harness, kind, len(hit), len(ok),
        len(reached), _rate([f.succeeded for f in reached]),
        len(absorbed), _rate([f.succeeded for f in absorbed]), len(ended),
        sum(x.retries for x in faults) / len(faults), _mean(times),
        sum(c.reward - f.reward for c, f, _ in hit) / len(hit),
        sum(f.false_success for _, f, _ in ok),
    )  # fmt: skip


def _outcome(fates: set[str]) -> str:
    """What a pair's faults of one kind came to: the rollout ended at one, else one reached
    the model, else the harness absorbed them all (retried, or no error)."""
    return next((f for f in (FATES[3], FATES[2]) if f in fates), FATES[1])


def _rate(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def sandbox_fault_fate(
    rollout_id: str, fault: SandboxFault, calls: Sequence[dict[str, Any]]
) -> Fault:
    """What became of a sandbox fault, from the rollout's calls in order (their bodies)."""
    asked = [
        i
        for i, call in enumerate(calls)
        for _, _, args in tool_calls(str(call["dialect"]), load_body(call["response_body"]))
        if _holds(args, fault.command)
    ]
    if not asked:
        return Fault(rollout_id, fault.kind.value, FATES[4], 0, None)
    first = asked[0]
    fate = FATES[2] if first + 1 < len(calls) else FATES[3]
    ok = next((c for c in calls[first + 1 :] if _succeeded(c, fault.at_us)), None)
    recover = (int(ok["received_us"]) - fault.at_us) / 1e6 if ok else None
    return Fault(rollout_id, fault.kind.value, fate, len(asked) - 1, recover)


def _fired(text: object) -> list[SandboxFault]:
    """The sandbox faults a verified event records (none where its value is not theirs: one
    bad record never stops the table)."""
    try:
        return SandboxFault.loads(str(text))
    except (ValueError, KeyError, TypeError):
        return []


def _succeeded(call: dict[str, Any], after_us: int) -> bool:
    """Whether ``call``, made after ``after_us``, carries a tool result that is not an error."""
    results = tool_results(str(call["dialect"]), load_body(call["request_body"]))
    return int(call["received_us"]) > after_us and any(not is_error(t, f) for _, t, f in results)


def _holds(arguments: str, command: str) -> bool:
    """Whether a tool call's arguments (JSON text) hold ``command`` as one of their values."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return False
    return isinstance(value, dict) and command in value.values()


def _by_rollout(calls: Result) -> dict[str, list[dict[str, Any]]]:
    """A query's rows (one per call, in order) as dicts, grouped by their rollout."""
    out: dict[str, list[dict[str, Any]]] = {}
    for values in calls.rows:
        call = dict(zip(calls.columns, values, strict=True))
        out.setdefault(str(call["rollout_id"]), []).append(call)
    return out


def faults_in(con: duckdb.DuckDBPyConnection) -> list[Fault]:
    """Every injected fault of a run, each with its fate: those of its calls (the
    ``fault_calls`` query), then those of its sandboxes (``fault_sandbox``)."""
    faults = [x for cs in _by_rollout(run(con, FAULT_CALLS)).values() for x in faults_of(cs)]
    fired = [(str(rollout_id), _fired(text)) for rollout_id, text in run(con, SANDBOX).rows]
    if not any(f for _, f in fired):
        return faults
    with_bodies = _by_rollout(run(con, CALLS))
    for rollout_id, fs in fired:
        faults += [sandbox_fault_fate(rollout_id, f, with_bodies.get(rollout_id, [])) for f in fs]
    return faults


def paired(
    clean: duckdb.DuckDBPyConnection, faulted: dict[str, duckdb.DuckDBPyConnection]
) -> Result:
    """The paired recovery table of each faulted run (by label) against the ``clean`` run."""
    twins = played(run(clean, PAIRABLE))
    rows: list[tuple[Any, ...]] = []
    for label, con in faulted.items():
        rows += table(label, pair(twins, played(run(con, PAIRABLE))), faults_in(con))
    return Result(PAIRED, COLUMNS, rows)


FATE_COLUMNS = ["rollout_id", "kind", "fate", "retries", "recover_s"]


def add_paired_views(
    con: duckdb.DuckDBPyConnection, clean: duckdb.DuckDBPyConnection, label: str
) -> None:
    """Two views on ``con`` (a faulted run's), for ``openforge query --clean``:
    ``fault_fates``, one row per fault injected into its calls (:data:`FATE_COLUMNS`: its fate,
    the retries of it, the seconds to recover), and ``fault_recovery``, its paired recovery
    table against the ``clean`` run (:data:`COLUMNS`, ``run`` = ``label``)."""
    import pyarrow as pa

    fates = [(f.rollout_id, f.kind, f.fate, f.retries, f.recover_s) for f in faults_in(con)]
    for name, columns, rows in (
        ("fault_fates", FATE_COLUMNS, fates),
        ("fault_recovery", COLUMNS, paired(clean, {label: con}).rows),
    ):
        table = pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})
        con.register(name, table)
