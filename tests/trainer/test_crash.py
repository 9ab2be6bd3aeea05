"""The trainer killed with SIGKILL (at a failpoint) before an update, after a weight swap, and
after a checkpoint, then restarted each time: every episode is trained exactly once, the policy
versions handed to vLLM strictly increase across the restarts (none is reused for other
weights), and metrics are appended."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from infra.eventlog import EPISODES_TOPIC, open_writer
from infra.failpoints import ENV
from infra.local.vllm import VLLMServer
from openforge.query.views import open_views
from schemas.codec import encode_message
from tests.trainer.test_loop import _consumed, _episodes


def _trainer(url: str, model: Path, out: Path, vllm: str, failpoint: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if failpoint is not None:
        env[ENV] = failpoint
    cmd = [
        sys.executable, "-m", "openforge", "trainer", "run", "--episodes", url,
        "--model", str(model), "--out", str(out), "--vllm", vllm, "--group-size", "4",
        "--token-budget", "80", "--idle-timeout", "3", "--lr", "1e-2",
        "--max-staleness", "100",  # the episodes are all of version 0: none is stale here
        "--archive", str(out / "archive"),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if failpoint is None:
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert f"failpoint {failpoint}" in done.stderr, done.stderr[-3000:]
    return done.returncode


def test_killed_anywhere_each_episode_is_trained_once_and_versions_never_repeat(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    url = f"local:{tmp_path / 'log'}"
    episodes = _episodes(24, tasks=6)  # six groups of four: one update each
    with open_writer(url) as writer:
        for e in episodes:
            writer.append(EPISODES_TOPIC, e.rollout_id.encode(), encode_message([e]))
    out = tmp_path / "run"
    for failpoint in (
        "trainer.before_update@2",  # update 1 checkpointed; update 2 never made
        "trainer.after_swap@3",  # vLLM serves update 3's weights; the checkpoint is at 2
        "trainer.after_checkpoint@4",  # checkpointed, the stream position not yet committed
    ):
        assert _trainer(url, tiny_model_dir, out, vllm_server.base_url, failpoint) == (
            -signal.SIGKILL
        )
    _trainer(url, tiny_model_dir, out, vllm_server.base_url, None)

    consumed = _consumed(out)
    assert sorted(consumed) == sorted(e.episode_id for e in episodes)  # each once, none lost
    steps = [json.loads(line)["step"] for line in (out / "consumed.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    versions = [
        json.loads(line)["version"] for line in (out / "versions.jsonl").read_text().splitlines()
    ]
    assert versions == sorted(set(versions)) and len(versions) == 7  # step 3 swapped twice
    state = json.loads(
        (
            out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text() / "state.json"
        ).read_text()
    )
    assert (state["step"], state["policy_version"]) == (6, versions[-1])
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]  # appended, redone steps once
    assert [float(r["policy/version"]) for r in rows][-1] == versions[-1]

    # The step lineage (written durably before each checkpoint) says the same: each step once,
    # as it was last made, with its episodes and the version its weights were served as.
    lineage = open_views(out / "archive").sql(
        "SELECT step, list(episode_id ORDER BY episode_id), any_value(policy_version) "
        "FROM steps GROUP BY step ORDER BY step"
    )
    ledger = [json.loads(line) for line in (out / "consumed.jsonl").read_text().splitlines()]
    assert lineage.fetchall() == [
        (row["step"], sorted(row["episodes"]), int(float(r["policy/version"])))
        for row, r in zip(ledger, rows, strict=True)
    ]
