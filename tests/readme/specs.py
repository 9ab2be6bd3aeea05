"""What each command the README and the manual run must do (:class:`Spec`), by its text as
written: tests/readme/test_readme.py runs the commands and checks them."""

from __future__ import annotations

import json
from pathlib import Path

from openforge.stack import LOCAL_MAX_TOKENS
from openforge.train.config_io import load_config
from tests.infra.harnesses.conftest import installed
from tests.infra.harnesses.recording import check_rollouts_run
from tests.openforge.train.checks import (
    check_audit,
    check_rebuilt,
    check_resumed,
    check_run,
    check_screenshot_run,
    check_web_run,
)
from tests.readme.session import Spec

ROOT = Path(__file__).resolve().parents[2]
# The README's short main job. Its held-out groups (4 samples of a task) are part of what the
# later commands train on: `trainer run` and `replay train` need groups whose rewards differ.
# Updates and evaluations keep their groups of 4 (the training and replay blocks below train on
# this run's log with groups of 4, and the replay needs rewarded episodes): only fewer held-out
# tasks are evaluated.
SHORT = " --set trainer.steps=2 --set evaluation.every=2 --set evaluation.tasks=2"
READY = r"running; press Ctrl-C to stop"
VLLM_PORT = r"vllm\s+http://127\.0\.0\.1:(\d+)/v1"
PROXY_READY = r"openforge proxy.* listening on http://127\.0\.0\.1:8100"
REGISTERED = r'"api_key":\s*"ofk_'


def _kube_run_checked(runs: Path) -> None:
    """The pods really ran each task's built image: the same verifier, run in the pod after
    each harness, gave 1 for the solution and 0 for nothing; what the containers printed was
    kept before the pods were deleted (sqlite-report's solution needs the sqlite3 and jq its
    Dockerfile's `RUN apt-get install` put in its image), and so was the final workspace."""
    tasks = {"sqlite-report", "run-as-user", "package-count", "notes-service"}
    for name, reward in (("oracle", 1.0), ("noop", 0.0)):
        rollouts = sorted((runs / name / "rollouts").iterdir())
        results = {(r := json.loads((d / "result.json").read_text()))["task_id"]: r
                   for d in rollouts}  # fmt: skip
        assert {t: (r["status"], r["reward"]) for t, r in results.items()} == {
            t: ("verified", reward) for t in tasks
        }, results
        assert all(f"reward: {int(reward)}" in (d / "verifier.out").read_text() for d in rollouts)
    sqlite = next((runs / "oracle" / "rollouts").glob("*sqlite-report*"))
    assert json.loads((sqlite / "agent.out").read_text())["grace"] == 104000
    # the final workspace came back from the pod (for `replay rescore`)
    note = json.loads((sqlite / "final-workspace.json").read_text())
    assert note["saved"] is True and (sqlite / "final-workspace.tar.gz").exists(), note


def _harness_runs(names: tuple[str, ...]) -> Spec:
    """Real harnesses' runs on the tiny model, one after another on one vLLM and one proxy:
    every rollout of each verified and its calls recorded (tests/infra/harnesses/recording.py)."""

    def check(work: Path, _: str) -> None:
        runs = work / "runs" / "harnesses"
        for name in names:  # one proxy and one event log served the three
            log = runs / "services" / "log"
            check_rollouts_run(runs / name, installed(name), LOCAL_MAX_TOKENS, log)

    return Spec(
        expect=tuple(
            rf"{name}: 1 verified, 0 gave up after infrastructure failures, [1-9]\d* calls recorded"
            for name in names
        ),
        timeout=1500,
        check=check,
    )


_DEMO = load_config(ROOT / "examples" / "cpu-demo.toml")
DEMO_RUN = Path(_DEMO.run.output_dir).relative_to(ROOT)  # runs/cpu-demo
DEMO_PER_UPDATE = _DEMO.tasks.per_step * _DEMO.rollouts.samples_per_task  # episodes per update


def _main_job_in_depth(work: Path, output: str) -> None:
    """The main job's run, every part of it (tests/openforge/train/checks.py)."""
    run = work / DEMO_RUN
    check_run(run, f"local:{run / 'log'}", per_update=DEMO_PER_UPDATE)
    check_audit(run, work / "runs" / "check-audit")


# The test command itself (this suite): CI runs exactly it (``.ci/run``).
TEST_COMMAND = "scripts/setup all && .venv/bin/python -m pytest"

SPECS: dict[str, Spec] = {
    "scripts/setup && .venv/bin/openforge train examples/cpu-demo.toml": Spec(
        expect=(r"2 updates in \d+ s; held-out reward \d\.\d+ \(v0\) -> \d\.\d+ \(v2\)",),
        extra=SHORT,
        timeout=2400,
        check=_main_job_in_depth,
    ),
    ".venv/bin/openforge services up": Spec(  # in the background: the proxy blocks use its vLLM
        service=True,
        ready=READY,
        expect=(r"kafka\s+kafka://", VLLM_PORT, "stopping"),
        capture={"PORT": VLLM_PORT, "KAFKA": r"kafka\s+(kafka://\S+)"},
    ),
    '.venv/bin/openforge serve --log "KAFKA?partitions=4" --vllm http://127.0.0.1:PORT --model '
    "runs/tiny --port 8200 --session-idle 5 --lateness 60 --reward-weight feedback=1 "
    "--reward-weight rule:call_errors=-1 --reward-weight judge=0.2 --reward-required feedback "
    "--reward-required judge --judge": Spec(
        service=True,
        ready=r"proxy http://127\.0\.0\.1:8200 \(open mode\); running",
        expect=(r"feedback: POST http://127\.0\.0\.1:8200/sessions/SESSION/reward", "stopping"),
    ),
    ".venv/bin/openforge traffic --proxy http://127.0.0.1:8200 --until-version 1 --sessions 60 "
    "--feedback-token-file runs/serve/feedback-token": Spec(
        expect=(
            r'"calls_failed": 0',
            r'"feedback_posted": [1-9]',
            r'"policy_version": [1-9]',
        ),
        timeout=600,
    ),
    "tail -n 3 runs/serve/trainer/metrics.csv": Spec(expect=(r"(?m)^[1-9]\d*,-?\d",)),
    '.venv/bin/openforge query --run runs/serve "SELECT step, count(*) AS episodes, '
    'max(policy_version) AS version FROM steps GROUP BY 1 ORDER BY 1"': Spec(
        expect=(r"│\s+1\s+│",)
    ),
    ".venv/bin/openforge model build-tiny runs/tiny --seed 0": Spec(
        expect=(r"runs/tiny\s+sha256:[0-9a-f]{16}",)
    ),
    ".venv/bin/openforge proxy --upstream http://127.0.0.1:PORT --log local:events": Spec(
        service=True, ready=PROXY_READY
    ),
    'curl -s -X POST localhost:8100/admin/rollouts -H "Authorization: Bearer $(cat '
    'proxy-admin-token)" -d \'{"task_id": "t1"}\'': Spec(expect=(REGISTERED,)),
    ".venv/bin/openforge proxy --upstream http://127.0.0.1:PORT --workers 4": Spec(
        service=True, ready=PROXY_READY
    ),
    'curl -s -X POST localhost:8100/admin/rollouts -H "Authorization: Bearer $(cat '
    "proxy-admin-token)\" -d '{}'": Spec(
        expect=(REGISTERED, r'"worker":\s*\d', r'"base_url":\s*"http://127\.0\.0\.1:\d+"')
    ),
    ".venv/bin/openforge rollouts run --tasks examples/tasks --harness oracle --n 2 "
    "--out runs/oracle": Spec(
        expect=(
            r"\b6 verified, 0 gave up after infrastructure failures, 0 calls recorded, "
            r"mean reward 1\.000",
        )
    ),
    ".venv/bin/openforge rollouts run --tasks examples/tasks/write-file "
    "--harness codex,claude-code,openclaw --agent-timeout-multiplier 3 "
    "--out runs/harnesses": _harness_runs(("codex", "claude-code", "openclaw")),
    ".venv/bin/openforge tasks check examples/web-tasks": Spec(
        expect=(r"5 tasks: 5 runnable here, 0 refused; oracle below 1 on 0",), timeout=900
    ),
    ".venv/bin/openforge train examples/web-demo.toml": Spec(
        expect=(r"2 updates in \d+ s; held-out reward \d\.\d+ \(v0\) -> \d\.\d+ \(v2\)",),
        timeout=1200,
        check=lambda work, _: check_web_run(
            work / "runs" / "web-demo", work / "runs" / "web-audit"
        ),
    ),
    ".venv/bin/openforge train examples/web-demo.toml --set model.base=tiny-vlm "
    "--set harness.observation=screenshot --set run.output_dir=runs/web-demo-vlm": Spec(
        expect=(r"2 updates in \d+ s; held-out reward \d\.\d+ \(v0\) -> \d\.\d+ \(v2\)",),
        timeout=1200,
        check=lambda work, _: check_screenshot_run(
            work / "runs" / "web-demo-vlm", work / "runs" / "web-vlm-audit"
        ),
    ),
    ".venv/bin/openforge tasks check examples/tasks": Spec(
        expect=(r"3 tasks: 3 runnable here, 0 refused; oracle below 1 on 0",)
    ),
    ".venv/bin/openforge tasks check examples/images": Spec(
        expect=(
            r"sqlite-report\s+│\s+container\s+│",
            r"run-as-user\s+│\s+container\s+│",
            r"package-count\s+│\s+container\s+│",
            r"notes-service\s+│\s+container\s+│",
            r"4 tasks: 4 runnable here, 0 refused; oracle below 1 on 0",
        )
    ),
    ".venv/bin/openforge services up --kube --no-kafka --no-vllm": Spec(
        service=True,
        ready=READY,
        expect=(r"export KUBECONFIG=/\S+", r"node\s+openforge-node-0"),
        capture={
            "KUBECONFIG_FILE": r"export KUBECONFIG=(\S+)",
            "IMAGE_SINK": r"--kube-image-sink (containerd://\S+);",
            "EGRESS_CANARY": r"--kube-egress-canary (\S+)",
        },
    ),
    ".venv/bin/openforge rollouts run --tasks examples/images --harness oracle,noop --backend "
    "kubernetes --kubeconfig KUBECONFIG_FILE --kube-image-sink IMAGE_SINK --kube-egress-canary "
    "EGRESS_CANARY --kube-cpu-request 0.25 --out runs/kube": Spec(
        expect=(
            r"oracle: 4 verified, 0 gave up after infrastructure failures, 0 calls recorded, "
            r"mean reward 1\.000",
            r"noop: 4 verified, 0 gave up after infrastructure failures, 0 calls recorded, "
            r"mean reward 0\.000",
        ),
        check=lambda work, _: _kube_run_checked(work / "runs" / "kube"),
    ),
    ".venv/bin/openforge pipeline run --source local:runs/cpu-demo/log --to local:runs/episodes "
    "--stop-when-idle 3": Spec(
        expect=(r"pipeline run \(streaming\) on FnApiRunner: .*episodes_emitted [1-9]",)
    ),
    ".venv/bin/openforge pipeline replay --from runs/cpu-demo/archive --to runs/replayed": Spec(
        expect=(r"pipeline replay \(batch\) on FnApiRunner: .*episodes_emitted [1-9]",)
    ),
    ".venv/bin/openforge pipeline run --source local:runs/cpu-demo/log "
    "--to local:runs/episodes-prism --stop-when-idle 3 --beam-arg=--runner=PrismRunner": Spec(
        expect=(r"pipeline run \(streaming\) on PrismRunner: .*episodes_emitted [1-9]",)
    ),
    ".venv/bin/openforge train examples/cpu-demo.toml": Spec(
        expect=(r"resum", r"2 updates in \d+ s"),
        extra=SHORT,
        timeout=1200,
        check=lambda work, output: check_resumed(work / DEMO_RUN, output),
    ),
    ".venv/bin/openforge train --show-config": Spec(expect=(r"\[trainer\]", r"\nsteps = ")),
    ".venv/bin/openforge model warm-start": Spec(capture={"MODEL_DIR": r"(/\S+)\s*\Z"}),
    ".venv/bin/openforge trainer run --episodes local:runs/cpu-demo/log --model MODEL_DIR "
    "--out runs/trainer --group-size 4 --groups-per-batch 1 --steps 2": Spec(
        expect=(r"2 steps, policy version 0 \(no --vllm",), timeout=900
    ),
    '.venv/bin/openforge query --run runs/cpu-demo "SELECT harness, count(*) AS episodes, '
    'avg(reward) FROM episodes GROUP BY ALL"': Spec(expect=(r"\bagent\b",)),
    '.venv/bin/openforge query --archive runs/cpu-demo/archive "SELECT * FROM tokens" '
    "--format parquet --out runs/tokens.parquet": Spec(
        expect=(r"\b[1-9]\d* rows written to /\S+/runs/tokens\.parquet",)
    ),
    ".venv/bin/openforge query --views": Spec(expect=(r"\bcompletions\b", r"\bepisodes\b")),
    ".venv/bin/openforge replay rebuild --from runs/cpu-demo/archive --to runs/rebuilt": Spec(
        expect=(r"identical: all \d+ archived episodes rebuilt as they were",),
        check=lambda work, _: check_rebuilt(work / DEMO_RUN, work / "runs" / "rebuilt"),
    ),
    ".venv/bin/openforge replay rescore --from runs/cpu-demo --tasks examples/echo-words": Spec(
        expect=(r"\b[1-9]\d* rollouts re-scored, \d+ rewards changed",), timeout=900
    ),
    ".venv/bin/openforge replay train --from runs/cpu-demo --model MODEL_DIR --out runs/retrain "
    "--where \"harness = 'agent' AND group_id NOT LIKE '%-eval-%'\"": Spec(
        expect=(r"RL on [1-9]\d* selected episodes: [1-9]\d* steps",), timeout=900
    ),
    ".venv/bin/openforge audit runs/cpu-demo --html runs/audit.html": Spec(
        expect=(r"\d+ rollouts, \d+ lifecycle events, \d+ calls",)
    ),
    ".venv/bin/openforge audit runs/cpu-demo --step 1": Spec(expect=(r"Lineage of step 1",)),
    ".venv/bin/openforge audit --compare runs/cpu-demo runs/cpu-demo": Spec(
        expect=(
            r"[1-9]\d* verified rollouts of runs/cpu-demo, [1-9]\d* verified rollouts of "
            r"runs/cpu-demo \(2\)",
            r"Busy fractions, by run",
        )
    ),
    ".venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy": Spec(
        expect=(r"Success: no issues found",)
    ),
}
