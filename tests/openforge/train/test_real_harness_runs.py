"""`openforge train` in the real harnesses (issue 49, items 5 and 6): OpenClaw's config with
``--harness codex,claude-code,openclaw`` (their lean prompts), shortened to 1 update, as a
user types it: one run per harness on equal terms, and their comparison. The raw tiny model
(no warm start): this checks the wiring, not the learning.

Checked beyond the main job's checks (``checks.check_run``): the trained calls are the
harness's own (its dialect, its prompt with its shell tool, recorded by the proxy), the updates
consumed exactly those episodes, and the adapter the harness was served after each update is
the one the trainer exported for it (vLLM's adapter and policy version on every later call).

OpenClaw's config raises every task's sandbox to 4 GiB (``rollouts.override_memory_mb``, as
Harbor's ``--override-memory-mb``): in the echo-words tasks' declared 1 GiB it is OOM-killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
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
from schemas.enums import CompletionStatus
from schemas.episode import Episode
from tests.openforge.train.checks import check_run

ROOT = Path(__file__).resolve().parents[3]


# The first test also sets up the three runs (each 1 update of one task x 2 samples and one
# held-out rollout at versions 0 and 1): the suite's 600 s per test is too short for them
# beside another worker.
pytestmark = pytest.mark.timeout(1800)

HARNESS_NAMES = ["codex", "claude-code", "openclaw"]
OUT = Path("runs") / "test-harnesses"  # relative, as a user types it


@pytest.fixture(scope="module")
def compared() -> Path:
    """The three real harnesses trained on equal terms in one command (item 5): OpenClaw's
    config (each task's sandbox at 4 GiB) with ``--harness codex,claude-code,openclaw``."""
    shutil.rmtree(ROOT / OUT, ignore_errors=True)  # a run directory left behind would resume
    overrides = [
        "warm_start.recipe=none",
        "trainer.steps=1",
        "tasks.per_step=1",
        "rollouts.samples_per_task=2",
        "evaluation.every=1",
        "evaluation.samples_per_task=1",
        "evaluation.tasks=1",
        # Short answers: on 2 busy cores a 512-token answer of the raw model can outlast the
        # task's 60 s (OpenClaw's own start takes 10-40 s of it), leaving no whole call to train.
        "proxy.max_tokens_cap=64",
        # Three times each task's 60 s: beside the other worker's load, OpenClaw's own start
        # (its gateway and session store) outlasted 60 s, and its rollouts ended with no call.
        "rollouts.agent_timeout_multiplier=3",
        f"run.output_dir={OUT}",
    ]
    argv = [sys.executable, "-m", "openforge", "train", "examples/cpu-demo-openclaw.toml"]
    for o in overrides:
        argv += ["--set", o]
    argv += ["--harness", ",".join(HARNESS_NAMES)]
    # The run's output goes to a file, not a pipe: a pipe would also wait for any child that
    # outlived the run. Its own session: if this test is cut short, the run is stopped as
    # Ctrl-C would (SIGTERM: it unwinds, stopping vLLM, the proxy, the pipeline and the
    # sandboxes), never orphaned; the deadline is below the module's timeout so that the
    # output's tail is shown.
    output = ROOT / "runs" / "test-harnesses.out"
    output.parent.mkdir(exist_ok=True)
    with output.open("w") as sink, subprocess.Popen(
        argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    ) as run:  # fmt: skip
        try:
            run.wait(timeout=1500)
        except subprocess.TimeoutExpired:
            _stop(run)
            pytest.fail("the run took over 1500 s; its output ends:\n" + _tail(output))
        except BaseException:
            _stop(run)
            raise
    assert run.returncode == 0, _tail(output)
    return ROOT / OUT


def _tail(output: Path) -> str:
    return output.read_text(errors="replace")[-6000:]


def _stop(run: subprocess.Popen[str]) -> None:
    """SIGTERM to the run's process group, SIGKILL after a minute."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)


def test_the_comparison_shows_each_harness_side_by_side(compared: Path) -> None:
    shown = {f["harness"]: f for f in json.loads((compared / "comparison.json").read_text())}
    assert sorted(shown) == sorted(HARNESS_NAMES)
    for figures in shown.values():
        assert sorted(figures["heldout"]) == ["0", "1"]  # versions 0 and 1, from eval.csv
        assert len(figures["train_reward"]) == 1 and figures["rollouts"] == 2 + 2
        assert figures["calls_per_rollout"] >= 1 and figures["prompt_tokens_per_call"] > 500
        assert figures["prefill_ms_per_call"] > 0 and figures["wall_s"] > 0
    png = (compared / "comparison.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    page = (compared / "comparison.html").read_text()
    assert all(name in page for name in HARNESS_NAMES)


@pytest.mark.parametrize("name", HARNESS_NAMES)
def test_an_update_on_the_real_harness_own_calls(name: str, compared: Path) -> None:
    run = compared / name
    log_url = f"local:{run / 'log'}"
    check_run(run, log_url, per_update=2, updates=1)

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
    # shared system prompt and tools served from the prefix cache.
    engine = json.loads((run / "engine.json").read_text())
    # vLLM counts the requests it finished: a call the harness left mid-stream (cut at the
    # rollout's time limit) was aborted there, and is recorded here with its status.
    finished = [c for c in calls if c.status == CompletionStatus.OK]
    assert engine["calls"] >= len(finished), (engine, [c.status for c in calls])
    assert engine["prefill_ms_per_call"] > 0 and engine["decode_ms_per_call"] > 0
    # More than one call's worth of prompt tokens came from the cache (the same harness prompt
    # each rollout; the first calls, made at once, find it empty).
    assert engine["prefix_cache_hit_rate"] * engine["calls"] > 1.0, engine
