"""`openforge train` with a real harness (issue 49, item 6): the main job's config with
``harness.name`` set to Codex, Claude Code or OpenClaw (their lean prompt), shortened to 2
updates, as a user types it. The raw tiny model (no warm start): this checks the wiring, not
the learning.

Checked beyond the main job's checks (``checks.check_run``): the trained calls are the
harness's own (its dialect, its prompt with its shell tool, recorded by the proxy), the updates
consumed exactly those episodes, and the adapter the harness was served after each update is
the one the trainer exported for it (vLLM's adapter and policy version on every later call).

OpenClaw's config raises every task's sandbox to 4 GiB (``rollouts.override_memory_mb``, as
Harbor's ``--override-memory-mb``): in the echo-words tasks' declared 1 GiB it is OOM-killed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from infra.eventlog import EPISODES_TOPIC, EVENTS_TOPIC, open_reader
from infra.harnesses import HARNESSES
from openforge.stack import tiny_model
from schemas.codec import decode_message
from schemas.completion import CompletionEvent
from schemas.delta import Reconstructor
from schemas.episode import Episode
from tests.openforge.train.checks import check_run

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["codex", "claude-code", "openclaw"])
def test_two_updates_on_the_real_harness_own_calls(name: str) -> None:
    out = Path("runs") / f"test-{name}"  # relative, as a user types it
    shutil.rmtree(ROOT / out, ignore_errors=True)  # a run directory left behind would resume
    overrides = [
        "warm_start.recipe=none",
        "trainer.steps=2",
        "tasks.per_step=2",
        "rollouts.samples_per_task=2",
        "evaluation.every=2",
        "evaluation.samples_per_task=1",
        "evaluation.tasks=2",
        f"run.output_dir={out}",
    ]
    argv = [sys.executable, "-m", "openforge", "train", f"examples/cpu-demo-{name}.toml"]
    for o in overrides:
        argv += ["--set", o]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = ROOT / out
    log_url = f"local:{run / 'log'}"
    check_run(run, log_url, per_update=4)

    with open_reader(log_url, [EVENTS_TOPIC, EPISODES_TOPIC], "harness-check") as reader:
        records = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    calls = sorted(
        (r for r in records if isinstance(r, CompletionEvent)),
        key=lambda e: (e.rollout_id, e.call_index),
    )
    harness = HARNESSES[name]()
    assert calls and {c.harness for c in calls} == {name}
    assert {c.dialect for c in calls} == {harness.dialect}
    tok = AutoTokenizer.from_pretrained(str(tiny_model(8192)))  # the config's model.context
    rebuild = Reconstructor()
    for call in calls:  # every call's prompt is the harness's own, with its shell tool
        prompt = str(tok.decode(rebuild.add(call)[0]))
        assert f'"name": "{harness.shell_tool.name}"' in prompt  # type: ignore[union-attr]
    # The updates consumed the episodes of these calls' rollouts.
    consumed = [
        json.loads(x) for x in (run / "trainer" / "consumed.jsonl").read_text().splitlines()
    ]
    episodes = {e.episode_id: e for e in records if isinstance(e, Episode)}
    trained = {episodes[e].rollout_id for row in consumed for e in row["episodes"]}
    assert trained <= {c.rollout_id for c in calls}
    # After update 1, the harness was served the adapter exported for policy version 1.
    by_version = {s.version for c in calls for s in c.policy_versions}
    assert {0, 1} <= by_version
    later = [c for c in calls if any(s.version == 1 for s in c.policy_versions)]
    assert later and all(c.model == "policy" for c in later)
    assert (run / "trainer" / "export" / "v1" / "adapter_model.safetensors").exists()
    # vLLM's own counters of the run's calls: prefill and decode split, and the harness's
    # shared system prompt and tools served from the prefix cache after the first calls.
    engine = json.loads((run / "engine.json").read_text())
    assert engine["calls"] >= len(calls)
    assert engine["prefill_ms_per_call"] > 0 and engine["decode_ms_per_call"] > 0
    assert engine["prefix_cache_hit_rate"] > 0.5, engine
