"""The main job with the warm pool off and on, side by side (issue 50, item 2).

    .venv/bin/python -m bench.warm_main_job [--order off on] [--out runs/bench-warm]

Code path measured: ``openforge train examples/cpu-demo.toml`` as a user runs it (a subprocess
per run, each in its own run directory), once with ``--set rollouts.warm_pool=false`` (every
agent in a cold container) and once with ``=true`` (the default: a pool of one member per
rollout slot, started ahead with the agent's Python and its SDK loaded), in the order given
(``--order off on on off`` for A-B-B-A). The warm start is built or reused before the first run
and not counted.

Per run: its wall time, the seconds its 8 updates took (the run's own figure), the held-out
reward at v0 and v8, and from the run's ``rollout_costs`` view the p50 of each rollout's wall
time and of its time to the first model call (``ready_s``), and the share of agents a warm
member ran. Proof of path: that share (``agent_warm``, recorded per rollout by the local
backend) is 0 with the pool off and above 0 with it on.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from bench.train_demo import run_one
from openforge.query.views import open_views

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "cpu-demo.toml"


def _costs(run: Path) -> dict[str, float]:
    con = open_views(run=run)
    row = con.execute(
        "SELECT count(*), median(wall_s), median(ready_s), avg(agent_warm), "
        "median(ready_s) FILTER (WHERE agent_warm = 1), median(ready_s) FILTER "
        "(WHERE agent_warm = 0) FROM rollout_costs"
    ).fetchone()
    assert row is not None
    keys = ("rollouts", "wall_p50", "ready_p50", "warm_share", "ready_warm_p50", "ready_cold_p50")
    nan = float("nan")
    return {k: (float(v) if v is not None else nan) for k, v in zip(keys, row, strict=True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--order", nargs="+", choices=["off", "on"], default=["off", "on"])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-warm")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    from openforge.train.config_io import load_config
    from openforge.train.launch import prepare_model

    prepare_model(load_config(CONFIG), say=lambda _: None)
    rows = []
    for i, mode in enumerate(args.order):
        out = args.out / f"{i}-{mode}"
        t0 = time.monotonic()
        pool = "true" if mode == "on" else "false"
        summary = run_one(CONFIG, out, [f"rollouts.warm_pool={pool}"])
        costs = _costs(out)
        assert (costs["warm_share"] > 0) == (mode == "on"), (mode, costs)
        rows.append((mode, summary, costs, time.monotonic() - t0))
        print(rows[-1], flush=True)
    print()
    print(
        "| run | pool | wall s | updates s | held-out v0 -> v8 | rollouts | rollout wall p50 s | "
        "ready p50 s | ready p50, warm / cold s | served warm |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (mode, s, c, wall) in enumerate(rows):
        print(
            f"| {i} | {mode} | {wall:.0f} | {s['seconds']:.0f} | {s['heldout_initial']:.3f} -> "
            f"{s['heldout_final']:.3f} | {c['rollouts']:.0f} | {c['wall_p50']:.2f} | "
            f"{c['ready_p50']:.2f} | {c['ready_warm_p50']:.2f} / {c['ready_cold_p50']:.2f} | "
            f"{c['warm_share']:.0%} |"
        )


if __name__ == "__main__":
    main()
