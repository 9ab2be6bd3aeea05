"""How each real harness meets the faults the proxy injects (issue 53, item 5): the same tasks
played clean and faulted, paired, by harness and fault kind.

    .venv/bin/python -m bench.fault_recovery --n 4

Code path: ``openforge rollouts run --harness agent,codex,claude-code,openclaw`` twice, as a user
types it (each harness unmodified in its sandbox, one vLLM on the tiny model and one proxy for
all), the second time with ``--fault http_503=R --fault http_429=R --fault stream_cut=R
--fault-seed S``; then ``openforge audit --compare CLEAN FAULTED``'s paired recovery table
(``openforge/audit/fault_recovery.py``) over the two runs' archives. Proof of path: the faulted
run's archive holds calls whose ``fault`` column is set, by kind, and each fault's fate is read
from the calls the harness made after it.

The tiny model does not solve the tasks (its clean rewards are 0), so the recovery rates are
empty here; what this measures is each harness's own handling of a fault: retried by the
harness (its retry loop absorbed it: the model never saw it), reached the model (it went on
with other calls) or ended the rollout (it stopped), with the retries per fault and the seconds
until its next call ended ok.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from openforge.audit.compare import compare
from openforge.audit.fault_recovery import FATES, PAIRED, faults_in
from openforge.audit.report import open_run

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = "agent,codex,claude-code,openclaw"
KINDS = ("http_503", "http_429", "stream_cut")


def _rollouts(out: Path, tasks: str, n: int, faults: list[str]) -> None:
    argv = [sys.executable, "-m", "openforge", "rollouts", "run", "--tasks", tasks,
            "--harness", HARNESSES, "--n", str(n), "--out", str(out), *faults]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode not in (0, 1):  # 1: a harness's rollout failed; its table still counts
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def _fates(faulted: Path) -> str:
    """Per harness and kind: every fault's fate, from the faulted run's own calls."""
    con = open_run(faulted)
    harness_of = dict(con.sql("SELECT DISTINCT rollout_id, harness FROM completions").fetchall())
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for fault in faults_in(con):
        key = (str(harness_of.get(fault.rollout_id, "?")), fault.kind)
        counts.setdefault(key, dict.fromkeys(FATES, 0))[fault.fate] += 1
    lines = ["| harness | kind | " + " | ".join(FATES) + " |", "|---|---|" + "---|" * len(FATES)]
    for (harness, kind), by in sorted(counts.items()):
        lines.append(f"| {harness} | {kind} | " + " | ".join(str(by[f]) for f in FATES) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4, help="samples per task")
    parser.add_argument("--rate", type=float, default=0.3, help="rate of each fault kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tasks", default="examples/tasks/write-file")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-fault-recovery")
    args = parser.parse_args()
    clean, faulted = args.out / "clean", args.out / "faulted"
    _rollouts(clean, args.tasks, args.n, [])
    plan = [f"--fault={kind}={args.rate}" for kind in KINDS] + [f"--fault-seed={args.seed}"]
    _rollouts(faulted, args.tasks, args.n, plan)
    report = compare([clean, faulted])
    table = next(s for s in report.sections if s.title == PAIRED.title).tables[0]
    print(f"clean {clean} vs faulted {faulted} ({', '.join(plan)})\n")
    print(_fates(faulted), "\n")
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.rows:
        print("| " + " | ".join(_cell(v) for v in row) + " |")


def _cell(value: object) -> str:
    return "" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
