"""``openforge traffic`` as users type it: a run where no call was answered exits 1 and says on
stderr why each call failed (a real proxy, not in open mode, refuses callers without a rollout
key; nothing reaches a model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from openforge.testing.proxy import proxy_config, running_proxy


def test_a_run_with_no_answered_call_exits_1_and_says_why_each_failed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = proxy_config(  # the model is never reached
        "http://127.0.0.1:1",
        tmp_path,
        upstream_model="tiny",
        tokenizer=tiny_model_dir,
        max_model_len=4096,
    )
    with running_proxy(config) as proxy:
        done = subprocess.run(
            [str(Path(sys.prefix) / "bin" / "openforge"), "traffic", "--proxy", proxy.url,
             "--sessions", "3", "--users", "1", "--feedback-fraction", "0"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (counts["calls_answered"], counts["calls_failed"]) == (0, 3), counts
    failures = [line for line in done.stderr.splitlines() if ": call failed: " in line]
    assert len(failures) == 3, done.stderr
    # Each names its session and the proxy's answer (its status and message).
    assert all(line.startswith("sim-") and ": call failed: 4" in line for line in failures)
