"""Harnesses side by side (``openforge train CONFIG --harness agent,codex,claude-code``): the
same config trained once per harness, on equal terms (same model, warm-start recipe and budget,
tasks, updates and seed), each into ``OUTPUT_DIR/HARNESS``; then one report in ``OUTPUT_DIR``:

- ``comparison.png``: held-out reward per policy version and train reward per update, one
  line per harness;
- ``comparison.json``: per harness, held-out reward per version, calls and tokens per rollout,
  prompt tokens per call, prefill and decode per call, the prefix cache's hit rate, the median
  seconds from a rollout's start to its first model call (agent ready), wall time;
- ``comparison.html``: the audit page of the runs side by side (``openforge audit --compare``:
  reward per step and by task, error recovery, cost per rollout, utilisation).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from openforge.train.report import read_metrics
from orchestrator.rundir import RunDir
from schemas.errors import ConfigError


def harness_overrides(names: Sequence[str], output_dir: Path) -> dict[str, list[str]]:
    """Each harness's ``--set`` overrides: its name and its run directory under
    ``output_dir``; a name given twice is refused (the runs would share a directory)."""
    if len(set(names)) != len(names) or not names:
        raise ConfigError(f"--harness needs distinct harness names, not {list(names)}")
    return {n: [f"harness.name={n}", f"run.output_dir={output_dir / n}"] for n in names}


@dataclass(frozen=True)
class HarnessFigures:
    """One harness's run, as the comparison shows it (per rollout: training and held-out)."""

    harness: str
    heldout: dict[int, float]  # policy version -> held-out mean reward
    train_reward: list[float]  # per update
    rollouts: int
    calls_per_rollout: float
    prompt_tokens_per_call: float
    generated_tokens_per_call: float
    tokens_per_rollout: float
    prefill_ms_per_call: float
    decode_ms_per_call: float
    prefix_cache_hit_rate: float
    agent_s_per_rollout: float
    verifier_s_per_rollout: float
    ready_s_p50: float | None  # attempt start to first model call (None: no rollout called)
    wall_s: float


def figures(harness: str, run: Path) -> HarnessFigures:
    """What ``run`` (one harness's run directory) shows for the comparison."""
    outcomes = [o for job in RunDir.found_in(run) for o in job.outcomes()]
    n = max(len(outcomes), 1)
    engine = json.loads((run / "engine.json").read_text())
    calls = sum(o.calls or 0 for o in outcomes) / n
    per_call = engine["prompt_tokens_per_call"] + engine["generated_tokens_per_call"]
    summary = json.loads((run / "summary.json").read_text())
    return HarnessFigures(
        harness=harness,
        heldout={int(v): float(r) for v, r in summary["heldout"].items()},
        train_reward=[r["reward/mean"] for r in read_metrics(run / "trainer" / "metrics.csv")],
        rollouts=len(outcomes),
        calls_per_rollout=round(calls, 2),
        prompt_tokens_per_call=round(engine["prompt_tokens_per_call"], 1),
        generated_tokens_per_call=round(engine["generated_tokens_per_call"], 1),
        tokens_per_rollout=round(calls * per_call, 1),
        prefill_ms_per_call=round(engine["prefill_ms_per_call"], 2),
        decode_ms_per_call=round(engine["decode_ms_per_call"], 2),
        prefix_cache_hit_rate=round(engine["prefix_cache_hit_rate"], 3),
        agent_s_per_rollout=round(sum(o.agent_s or 0.0 for o in outcomes) / n, 2),
        verifier_s_per_rollout=round(sum(o.verifier_s or 0.0 for o in outcomes) / n, 2),
        ready_s_p50=_median([o.ready_s for o in outcomes if o.ready_s is not None]),
        wall_s=float(summary["seconds"]),
    )


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def write_comparison(output_dir: Path, runs: dict[str, Path]) -> list[Path]:
    """The comparison of ``runs`` (harness -> run directory) in ``output_dir``; its files."""
    from openforge.audit import html
    from openforge.audit.compare import compare

    shown = [figures(name, run) for name, run in runs.items()]
    data = output_dir / "comparison.json"
    data.write_text(json.dumps([asdict(f) for f in shown], indent=2) + "\n")
    chart = _plot(output_dir / "comparison.png", shown)
    page = html.write(compare(list(runs.values())), output_dir / "comparison.html")
    return [data, chart, page]


def _plot(path: Path, shown: list[HarnessFigures]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held, train) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for f in shown:
        versions = sorted(f.heldout)
        held.plot(versions, [f.heldout[v] for v in versions], marker="o", label=f.harness)
        steps = range(1, len(f.train_reward) + 1)
        train.plot(steps, f.train_reward, marker=".", alpha=0.8, label=f.harness)
    for ax, title, x in [
        (held, "held-out reward", "policy version"),
        (train, "train reward", "update"),
    ]:
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    held.set_ylabel("mean reward")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
