"""Safe promotion (trainer.promotion): ``openforge trainer run --promotion-prompts`` loads each
candidate into a real vLLM beside the served policy, has both answer held-out prompts and the
base model judge them; a candidate that regresses beyond the allowance is held (the served
version stays, training goes on), one that does not is served as the next version. Both are
recorded in promotions.jsonl, the steps' metrics and the audit. Bad held-out files are refused
saying what a line looks like."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from infra.eventlog import EPISODES_TOPIC, open_writer
from infra.local.vllm import VLLMServer
from openforge.audit.report import build
from schemas.codec import encode_message
from schemas.errors import ConfigError
from tests.trainer.test_loop import _episodes
from trainer.promotion import CANDIDATE, Check, load_prompts

PROMPTS = [
    {"prompt": "Name a prime number."},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]},
]


def _trainer(tmp: Path, vllm: str, out: str, max_regression: str) -> str:
    """``openforge trainer run`` from ``tmp`` with relative paths, as a user types it."""
    argv = [
        sys.executable, "-m", "openforge", "trainer", "run", "--episodes", f"local:{out}-log",
        "--model", "model", "--out", out, "--vllm", vllm, "--serve-at-start",
        "--group-size", "4", "--token-budget", "80", "--idle-timeout", "3", "--lr", "1e-2",
        "--max-staleness", "100", "--archive", f"{out}/archive",
        "--promotion-prompts", "heldout.jsonl", "--promotion-judge-model", "tiny",
        f"--promotion-max-regression={max_regression}", "--promotion-max-tokens", "8",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_regressing_candidate_is_held_and_one_that_does_not_is_served(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "model").symlink_to(tiny_model_dir)
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    for run in ("held", "served"):  # each run its own log (a trainer's offsets are kept)
        with open_writer(f"local:{tmp_path / run}-log") as writer:
            for e in _episodes(12, tasks=3):  # three groups of four: three updates
                writer.append(EPISODES_TOPIC, e.rollout_id.encode(), encode_message([e]))

    # Held: no candidate can be 2 better than the served policy on a 0-1 scale.
    held = _trainer(tmp_path, vllm_server.base_url, "held", "-2")
    assert "3 steps, policy version 0" in held and "held" in held, held[-2000:]
    checks = _lines(tmp_path / "held" / "promotions.jsonl")
    assert [c["step"] for c in checks] == [1, 2, 3] and not any(c["promoted"] for c in checks)
    assert {c["served_version"] for c in checks} == {0} and {
        c["candidate_version"] for c in checks
    } == {1}
    assert all(0.0 <= float(c["candidate_score"]) <= 1.0 for c in checks)  # type: ignore[arg-type]
    assert not (tmp_path / "held" / "versions.jsonl").exists()  # nothing served after v0
    models = {m["id"] for m in httpx.get(f"{vllm_server.base_url}/v1/models").json()["data"]}
    assert {"policy", CANDIDATE} <= models  # the candidate was loaded beside the served one

    # Served: any candidate within 2 of the served policy is promoted.
    served = _trainer(tmp_path, vllm_server.base_url, "served", "2")
    assert "3 steps, policy version 3" in served, served[-2000:]
    checks = _lines(tmp_path / "served" / "promotions.jsonl")
    assert [(c["served_version"], c["candidate_version"], c["promoted"]) for c in checks] == [
        (0, 1, True), (1, 2, True), (2, 3, True),
    ]  # fmt: skip
    assert [v["version"] for v in _lines(tmp_path / "served" / "versions.jsonl")] == [1, 2, 3]

    # The steps' metrics and the audit say the same.
    rows = list(csv.DictReader((tmp_path / "held" / "metrics.csv").read_text().splitlines()))
    assert [float(r["promotion/promoted"]) for r in rows] == [0.0, 0.0, 0.0]
    report = build(tmp_path / "held")
    table = next(t for s in report.sections for t in s.tables if t.query.name == "promotions")
    assert table.column("promoted") == [False, False, False]
    assert table.column("policy_version") == [0, 0, 0]


def test_a_check_promotes_within_the_allowance() -> None:
    assert Check(0.5, 0.5, 0.0).promoted and Check(0.45, 0.5, 0.05).promoted
    assert not Check(0.4, 0.5, 0.05).promoted and not Check(0.9, 0.5, -0.5).promoted


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no prompt"),
        ("{not json\n", "not JSON"),
        ('{"prompt": 3}\n', 'write {"prompt"'),
        ('{"messages": [{"content": "x"}]}\n', 'write {"prompt"'),
    ],
)
def test_bad_held_out_files_are_refused_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_prompts(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_prompts(tmp_path / "nowhere.jsonl")


def test_the_gate_needs_its_held_out_set_and_vllm(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "openforge", "trainer", "run", "--episodes", "local:log"]
    argv += ["--model", "m", "--out", "o"]
    for extra, message in (
        (["--promotion-judge-model", "tiny"], "need --promotion-prompts"),
        (["--promotion-prompts", "h.jsonl"], "needs --vllm"),
    ):
        done = subprocess.run(
            [*argv, *extra], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1 and message in done.stderr, done.stderr[-2000:]
