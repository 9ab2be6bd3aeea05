"""The web tasks (examples/web-tasks) and the browser agent, through the real local backend:
each task's image (Debian's Chromium, its app started by the image's ENTRYPOINT) is built with
buildah and run in runc containers; the oracle (a scripted browser run) scores 1 and noop 0; the
browser harness drives Chromium in the sandbox through the proxy, in the Chat Completions and
Messages dialects, and reaches nothing but the proxy and the task's own app.

The model that picks the browser harness's actions here is a scripted policy (the harness
issue's allowance: the harness, Chromium, the app, the proxy and the verifier are real); the
last test runs the same harness with the real tiny model on vLLM (and on screenshots with the
tiny VLM: tests/orchestrator/test_web_tasks_vlm.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from infra.harnesses import Browser, BrowserAnthropic, NoOp, Oracle
from infra.local.vllm import VLLMServer
from infra.tasks import load_dataset, load_task
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, read_events
from orchestrator.rundir import Status
from schemas.enums import CompletionStatus
from tests.orchestrator.conftest import ROOT, job

WEB = ROOT / "examples" / "web-tasks"
NAMES = ["newsletter-signup", "settings-save", "shop-order", "profile-login", "flight-booking"]


def test_the_shared_files_of_the_web_tasks_are_generated_current_and_single_source() -> None:
    done = subprocess.run(
        [sys.executable, "examples/web-tasks/generate.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The browser agent's driver has one source: loading the set copies it into each solution.
    load_dataset(WEB)
    for name in NAMES:
        for module in ("browser_cdp.py", "browser_tree.py"):
            source = ROOT / "infra" / "harnesses" / module
            assert (WEB / name / "solution" / module).read_bytes() == source.read_bytes()
    tracked = subprocess.run(
        ["git", "ls-files", "examples/web-tasks"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert tracked and not [f for f in tracked if f.endswith(("browser_cdp.py", "browser_tree.py"))]


def test_oracle_1_and_noop_0_on_every_web_task(tiny_model_dir: Path, tmp_path: Path) -> None:
    tasks = load_dataset(WEB)
    assert [t.id for t in tasks] == NAMES
    with job(tmp_path / "oracle", Oracle(), tiny_model_dir) as oracle:
        notes = oracle.orchestrator.check(tasks)
        solved = oracle.run(tasks)
    with job(tmp_path / "noop", NoOp(), tiny_model_dir) as noop:
        nothing = noop.run(tasks)
    assert {(r.task_id, r.status, r.reward) for r in solved} == {
        (n, Status.VERIFIED, 1.0) for n in NAMES
    }
    assert {(r.task_id, r.status, r.reward) for r in nothing} == {
        (n, Status.VERIFIED, 0.0) for n in NAMES
    }
    assert all(": image localhost/openforge/task:" in line for line in notes), notes
    # The app ran in the agent's container and left its state in the final workspace.
    (flight,) = [r for r in solved if r.task_id == "flight-booking"]
    state = oracle.out / "rollouts" / flight.rollout_id / "workspace" / "data" / "state.json"
    assert json.loads(state.read_text())["bookings"] == [
        {"flight": "OF103", "passenger": "Alan Turing"}
    ]


@pytest.fixture
def host_service() -> tuple[str, list[str]]:
    """An HTTP server on this machine's loopback: the agent's browser must not reach it."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/secret", hits


@pytest.mark.parametrize("harness", [Browser, BrowserAnthropic], ids=["chat", "messages"])
def test_the_browser_agent_does_a_web_task_through_the_proxy(
    harness: type[Browser],
    host_service: tuple[str, list[str]],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    outside, hits = host_service
    task = load_task(WEB / "newsletter-signup")
    plan: list[dict[str, object] | tuple[str, dict[str, object]]] = [
        ("navigate", {"url": outside}),
        ("type", {"element": 1, "text": "ada@example.org"}),
        ("click", {"element": 2}),
        ("done", {"answer": "Subscribed."}),
    ]
    script = Script("done", {}, plans={"The Weekly Byte": plan})
    with (
        serving(ScriptedPolicy(tiny_model_dir, script)) as url,
        job(tmp_path, harness(max_turns=6), tiny_model_dir, upstream=url) as j,
    ):
        (record,) = j.run([task])
        j.proxy.flush()
        events = completions_of(read_events(j.proxy.config.log_url, want=4), record.rollout_id)
    root = j.out / "rollouts" / record.rollout_id
    lines = [json.loads(x) for x in (root / "agent.out").read_text().splitlines() if x.strip()]
    actions = [(x["name"], x["result"].split(":")[0]) for x in lines if x["type"] == "action"]
    assert actions == [("navigate", "error"), ("type", "ok"), ("click", "ok"), ("done", "done")]
    refused = next(x["result"] for x in lines if x["type"] == "action")
    assert "cannot open" in refused and "ERR_" in refused, refused
    assert hits == []  # the host's own services are out of the sandbox's reach
    assert lines[-1]["stop"] == "done" and lines[-1]["final_message"] == "Subscribed."
    assert record.status is Status.VERIFIED and record.reward == 1.0, record
    # Agent ready: its sandbox, the app, Chromium and the harness started before its first call.
    assert record.ready_s is not None and record.agent_s is not None
    assert 0 < record.ready_s < record.agent_s + 5, record
    state = json.loads((root / "workspace" / "data" / "state.json").read_text())
    assert state["subscribers"] == ["ada@example.org"]
    # Four calls, each recorded with the engine's tokens, in the harness's dialect.
    assert [e.call_index for e in events] == [0, 1, 2, 3]
    assert all(e.status is CompletionStatus.OK and e.completion_token_ids for e in events)
    assert {e.dialect for e in events} == {harness.dialect}


def test_the_browser_agent_runs_on_the_real_tiny_model(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The tiny model answers noise: what is checked is that the page reached the engine as
    the prompt, every call was recorded, and the rollout ended verified (reward 0 or 1)."""
    task = load_task(WEB / "settings-save")
    harness = Browser(max_turns=2, max_tokens=24)
    with job(tmp_path, harness, tiny_model_dir, upstream=vllm_server.base_url) as j:
        (record,) = j.run([task])
        j.proxy.flush()
        events = completions_of(read_events(j.proxy.config.log_url, want=1), record.rollout_id)
    root = j.out / "rollouts" / record.rollout_id
    lines = [json.loads(x) for x in (root / "agent.out").read_text().splitlines() if x.strip()]
    assert record.status is Status.VERIFIED and record.reward in (0.0, 1.0), record
    assert lines[-1]["type"] == "final" and lines[-1]["stop"] in {"answer", "done", "max_turns"}
    steps = [x for x in lines if x["type"] == "step"]
    assert len(events) == len(steps) >= 1
    assert all(e.status is CompletionStatus.OK and e.completion_token_ids for e in events)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    prompt = tokenizer.decode(events[0].prompt_token_ids)
    assert '[1] combobox "Theme" value="Light"' in prompt and '"name": "click"' in prompt
