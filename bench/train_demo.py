"""The main job's acceptance figures: held-out reward before and after RL, per seed, with an lr=0
control run side by side in the same report.

    .venv/bin/python -m bench.train_demo [--seeds 0 1 2] [--config examples/cpu-demo.toml]
    .venv/bin/python -m bench.train_demo --config examples/cpu-demo-codex.toml \
        --out runs/bench-train-codex --min-gain 0.25 --max-wall-s 1800   # a real harness

Code path measured: ``openforge train CONFIG`` as a user runs it (a subprocess per run, each in
its own run directory): the cached warm start, vLLM with the LoRA adapter hot-loaded every
update, the capture proxy, the streaming Beam pipeline, the orchestrator with the built-in
``agent`` harness in bubblewrap sandboxes, the CPU trainer on veRL's GRPO loss. Proof of path:
each run's ``summary.json`` (written by the run at its end) gives the updates made and the
policy version served, and its event log must hold completions stamped with more than one
policy version (zero for the control, whose adapter never changes but is still swapped in).

The warm start is built before the first run (or reused from the cache) and not counted in the
runs' wall times; its own time is reported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from infra.eventlog import EVENTS_TOPIC, open_reader
from schemas.codec import decode_message
from schemas.completion import CompletionEvent

ROOT = Path(__file__).resolve().parents[1]


def _versions_stamped(run_dir: Path) -> set[int]:
    with open_reader(f"local:{run_dir / 'log'}", [EVENTS_TOPIC], "bench") as reader:
        events = [e for rec in reader.poll(1_000_000, 2.0) for e in decode_message(rec.value)]
    return {s.version for e in events if isinstance(e, CompletionEvent) for s in e.policy_versions}


def update_kls(run_dir: Path, model_dir: Path) -> list[float]:
    """Per update k: the mean over the batch's generated tokens of KL(policy v(k-1) || v(k)),
    exact over the vocabulary, from the adapters the run exported (``trainer/export/v*``)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from infra.eventlog import EPISODES_TOPIC
    from schemas.episode import Episode

    with open_reader(f"local:{run_dir / 'log'}", [EPISODES_TOPIC], "bench-kl") as reader:
        episodes = {
            e.episode_id: e
            for rec in reader.poll(1_000_000, 2.0)
            for e in decode_message(rec.value)
            if isinstance(e, Episode)
        }
    steps = [json.loads(line) for line in (run_dir / "trainer" / "consumed.jsonl").open()]

    def policy(version: int) -> object:
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        return PeftModel.from_pretrained(base, str(run_dir / "trainer" / "export" / f"v{version}"))

    kls = []
    for row in steps:
        k = int(row["step"])
        before, after = policy(k - 1), policy(k)
        total, count = 0.0, 0
        with torch.no_grad():
            for eid in row["episodes"]:
                for sample in episodes[eid].samples:
                    ids = torch.tensor([sample.token_ids])
                    p = torch.log_softmax(before(input_ids=ids).logits[0, :-1], -1)  # type: ignore[operator]
                    q = torch.log_softmax(after(input_ids=ids).logits[0, :-1], -1)  # type: ignore[operator]
                    mask = torch.tensor(sample.loss_mask[1:], dtype=torch.bool)
                    kl = (p.exp() * (p - q)).sum(-1)[mask]
                    total, count = total + float(kl.sum()), count + int(mask.sum())
        kls.append(total / max(count, 1))
    return kls


def run_one(config: Path, out: Path, overrides: list[str]) -> dict[str, object]:
    argv = [
        sys.executable,
        "-m",
        "openforge",
        "train",
        str(config),
        "--set",
        f"run.output_dir={out}",
    ]
    for o in overrides:
        argv += ["--set", o]
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    summary: dict[str, object] = json.loads((out / "summary.json").read_text())
    summary["wall_s"] = round(wall, 1)
    summary["versions_stamped"] = sorted(_versions_stamped(out))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "cpu-demo.toml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-train")
    p.add_argument(
        "--kl-only", action="store_true", help="only measure per-update KL of the runs in --out"
    )
    p.add_argument("--min-gain", type=float, default=0.2, help="held-out rise every seed needs")
    p.add_argument("--max-wall-s", type=float, default=600, help="the most a run may take")
    args = p.parse_args()
    if args.kl_only:
        from openforge.train.config_io import load_config
        from openforge.train.launch import prepare_model

        model = prepare_model(load_config(args.config), say=lambda _: None)
        for run in sorted(d for d in args.out.iterdir() if (d / "trainer").exists()):
            kls = update_kls(run, model)
            print(f"{run.name}: per-update KL max {max(kls):.5f}, mean {sum(kls) / len(kls):.5f}")
        return
    import shutil

    shutil.rmtree(args.out, ignore_errors=True)
    # Build (or reuse) the warm start once, outside the timed runs.
    from openforge.train.config_io import load_config
    from openforge.train.launch import prepare_model

    t0 = time.monotonic()
    prepare_model(load_config(args.config), say=lambda _: None)
    print(f"warm start ready in {time.monotonic() - t0:.0f} s", flush=True)
    rows = []
    for seed in args.seeds:
        rows.append(
            ("rl", seed, run_one(args.config, args.out / f"seed{seed}", [f"trainer.seed={seed}"]))
        )
        print(rows[-1], flush=True)
    control = run_one(
        args.config, args.out / "control", ["trainer.lr=0", f"trainer.seed={args.seeds[0]}"]
    )
    rows.append(("control lr=0", args.seeds[0], control))
    print(rows[-1], flush=True)
    print()
    print(
        "| run | seed | held-out v0 | held-out final | ratio | train first | train last | "
        "max behavior KL | updates | versions stamped | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for kind, seed, s in rows:
        h0, h1 = s["heldout_initial"], s["heldout_final"]
        assert isinstance(h0, float) and isinstance(h1, float)
        ratio = h1 / h0 if h0 > 0 else float("inf")
        if kind == "rl":
            gain, wall = h1 - h0, float(s["wall_s"])  # type: ignore[arg-type]
            ok &= ratio >= 2.0 and gain >= args.min_gain and wall <= args.max_wall_s
        print(
            f"| {kind} | {seed} | {h0:.3f} | {h1:.3f} | {ratio:.2f} | {s['train_first']:.3f} | "
            f"{s['train_last']:.3f} | {s['max_behavior_kl']:.4f} | {s['updates']} | "
            f"{s['versions_stamped']} | {s['wall_s']} |"
        )
    verdict = "met" if ok else "NOT met"
    print(
        f"\nacceptance (every seed: held-out >= 2x and +{args.min_gain}, "
        f"<= {args.max_wall_s:.0f} s): {verdict}"
    )


if __name__ == "__main__":
    main()
