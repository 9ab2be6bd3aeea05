"""`openforge train examples/web-demo.toml`, as a user types it: RL on the web tasks with the
browser agent, each rollout in a container of its task's image (Chromium and the task's app),
the page shown to the model as its accessibility tree; the same report, archive and checks as
the main job. The tiny model is not warm-started for the browser, so rewards stay 0: this
checks the loop on web tasks, not learning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from infra.eventlog import EVENTS_TOPIC, open_reader
from infra.tasks import load_dataset
from openforge.stack import tiny_model
from schemas.codec import decode_message
from schemas.completion import CompletionEvent
from tests.openforge.train.checks import check_audit, check_run

ROOT = Path(__file__).resolve().parents[3]


def test_the_web_demo_trains_the_browser_agent_on_the_web_tasks(tmp_path: Path) -> None:
    out = tmp_path / "web-demo"
    argv = [sys.executable, "-m", "openforge", "train", "examples/web-demo.toml"]
    argv += ["--set", f"run.output_dir={out}"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 updates in" in done.stdout
    heldout = {t.id for t in load_dataset(ROOT / "examples" / "web-tasks", split="heldout")}
    assert heldout == {"profile-login", "flight-booking"}
    check_run(out, f"local:{out / 'log'}", per_update=3 * 2, heldout=heldout)
    check_audit(out, tmp_path)
    results = [json.loads(p.read_text()) for p in out.glob("*/rollouts/*/result.json")]
    assert len(results) == 2 * 6 + 2 * 2  # two updates of 6; evaluations at v0 and v2 of 2
    assert all(r["status"] == "verified" and r["calls"] >= 1 for r in results), results
    # What the model was shown: the browser's tools and the task's page, from its container.
    with open_reader(f"local:{out / 'log'}", [EVENTS_TOPIC], "web-demo") as reader:
        events = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    calls = [e for e in events if isinstance(e, CompletionEvent)]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model(4096, 0)))  # the run's model
    prompt = tokenizer.decode(calls[0].prompt_token_ids)
    assert "URL: http://127.0.0.1:8765/" in prompt and '"name": "navigate"' in prompt
