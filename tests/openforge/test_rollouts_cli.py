"""``openforge rollouts run`` as a user runs it: a real process that starts its own proxy, plays
the example tasks in sandboxes, prints a summary; SIGTERM stops it with nothing left running."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.local.process import leftover_processes
from infra.local.vllm import VLLMServer
from openforge.query.views import open_views
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from schemas.completion import CompletionEvent
from schemas.rollout import RolloutEvent
from tests.openforge.train.checks import processes_mentioning

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "openforge", "rollouts", "run", *args]


def test_two_harnesses_in_turn_on_one_proxy_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        _cli(
            "--tasks", "examples/tasks", "--harness", "oracle,noop", "--n", "2", "--out", str(out)
        ),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())
    assert "oracle: 6 verified, 0 gave up" in said and "mean reward 1.000" in said
    assert "noop: 6 verified, 0 gave up" in said and "mean reward 0.000" in said
    for harness, reward in (("oracle", "1.0"), ("noop", "0.0")):
        rows = list(csv.DictReader((out / harness / "summary.csv").open()))
        assert len(rows) == 6 and {r["reward"] for r in rows} == {reward}
        assert all(r["rollout_id"].startswith(f"{harness}-") for r in rows)  # ids of its own
    assert (out / "services" / "log").is_dir()  # one embedded event log and proxy for both
    # ... and one archive of its events, both harnesses' (what `openforge audit OUT` reads)
    assert sorted(p.name for p in out.iterdir()) == ["archive", "noop", "oracle", "services"]
    harnesses = open_views(run=out).sql("SELECT DISTINCT harness FROM rollouts").fetchall()
    assert sorted(h for (h,) in harnesses) == ["noop", "oracle"]


def test_a_harness_named_twice_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        _cli("--tasks", "examples/tasks", "--harness", "oracle,oracle", "--out", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1 and "several once each joined by commas" in " ".join(
        done.stderr.split()
    )
    assert not (tmp_path / "services").exists()


def test_a_bad_fault_or_a_fault_without_the_runs_own_proxy_is_refused_first(
    tmp_path: Path,
) -> None:
    for args, said in (
        (["--fault", "http_418=0.1"], "unknown fault 'http_418': one of http_500"),
        (["--fault", "http_503=0.1", "--proxy", "http://127.0.0.1:9"], "leave out --proxy"),
        (
            ["--fault", "command_fails_once=1", "--backend", "kubernetes"],
            "the kubernetes backend does not inject sandbox faults (command_fails_once) yet",
        ),
    ):
        done = subprocess.run(
            _cli("--tasks", "examples/tasks", "--out", str(tmp_path), *args),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert done.returncode == 1 and said in " ".join(done.stderr.split()), done.stderr
        assert not (tmp_path / "services").exists()  # nothing was started


def test_sigterm_cancels_cleanly(tmp_path: Path) -> None:
    task = tmp_path / "slow"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Wait.\n")
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 600\n')
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("sleep 1000 & sleep 1000\n")
    proc = subprocess.Popen(
        _cli("--tasks", str(task), "--harness", "oracle", "--n", "2", "--out", str(tmp_path / "r")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 120
    rollouts = tmp_path / "r" / "rollouts"
    while time.monotonic() < deadline:  # the proxy and two sandboxes are up
        if len(leftover_processes(proc.pid)) >= 3 and len(list(rollouts.glob("*/agent.out"))) == 2:
            break
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output[-3000:]
    assert "cancelled" in output
    assert leftover_processes(proc.pid) == []  # its proxy and sandboxes are gone


def _served_warm(log_url: str) -> bool:
    """Whether a verified rollout in the log so far was served by a warm member."""
    records = read_events(log_url, group=f"warm-{time.monotonic_ns()}", want=0, timeout=1.0)
    return any(
        isinstance(e, RolloutEvent) and e.phase == "verified" and e.costs.get("agent_warm") == 1.0
        for e in records
    )


def test_a_warm_pool_serves_agents_and_sigterm_leaves_no_member_behind(
    tmp_path: Path, tiny_model_dir: Path, vllm_server: VLLMServer
) -> None:
    """The built-in agent on the tiny model (the session's vLLM, behind a proxy given with
    --proxy) with --warm-pool: after the first rollouts ask for members, later agents run in
    members started ahead and reach the model from there (each verified rollout records
    ``agent_warm``; a warm one's output is the agent's, start to final); SIGTERM mid-run stops
    the standing-by members too: no process, no directory left."""
    out = tmp_path / "r"
    config = proxy_config(vllm_server.base_url, tmp_path / "proxy", tokenizer=tiny_model_dir)
    with running_proxy(config, unix_socket=tmp_path / "proxy" / "proxy.sock") as proxy:
        assert proxy.unix_socket is not None
        args = ["--tasks", "examples/tasks/write-file", "--harness", "agent", "--n", "12"]
        args += ["--concurrency", "2", "--warm-pool", "--out", str(out), "--proxy", proxy.url]
        args += ["--proxy-socket", str(proxy.unix_socket)]
        proc = subprocess.Popen(
            _cli(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "OPENFORGE_ADMIN_TOKEN": config.admin_token or ""},
        )
        warm = out / "warm"
        # Until an agent was served warm (its verified event says so) and a member stands by:
        # under load the first members can be ready only after several cold rollouts.
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if processes_mentioning(str(warm)) and _served_warm(config.log_url):
                break
            time.sleep(1.0)
        assert proc.poll() is None, "the run ended before an agent was served warm"
        assert processes_mentioning(str(warm)), "no warm member stands by"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
        proxy_log = config.log_url
    assert proc.returncode == 130, output[-3000:]
    assert leftover_processes(proc.pid) == []
    assert processes_mentioning(str(warm)) == []  # no member's process
    assert not warm.exists() or list(warm.iterdir()) == []
    records = read_events(proxy_log, want=1)
    verified = [e for e in records if isinstance(e, RolloutEvent) and e.phase == "verified"]
    served = [e for e in verified if e.costs.get("agent_warm") == 1.0]
    assert served and all("agent_warm" in e.costs for e in verified), [e.costs for e in verified]
    called = {e.rollout_id for e in records if isinstance(e, CompletionEvent)}
    for e in served:  # the agent ran in the member, and called the model from there
        assert e.rollout_id in called
        lines = (out / "rollouts" / e.rollout_id / "agent.out").read_text().splitlines()
        kinds = [json.loads(line)["type"] for line in lines]
        assert kinds[0] == "start" and kinds[-1] == "final", kinds


def test_a_run_whose_rollouts_gave_up_fails_and_names_the_first_failure(tmp_path: Path) -> None:
    """A verifier that writes no reward is an infrastructure failure; once every attempt failed
    so, the run is no success: exit 1, the first failure's message and where its files are."""
    task = tmp_path / "broken"
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text("echo 'the verifier forgot its reward'\n")
    (task / "solution" / "solve.sh").write_text("true\n")
    done = subprocess.run(
        _cli("--tasks", str(task), "--max-attempts", "1", "--out", str(tmp_path / "r")),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "0 verified, 1 gave up after infrastructure failures" in output
    assert "first failure" in output and "reward" in output
    assert str(tmp_path / "r" / "rollouts") in output
