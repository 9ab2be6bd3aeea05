"""Each real harness (Codex CLI, Claude Code, OpenClaw) and the built-in agent, unmodified,
completes the write-file example in its sandbox through the proxy, and its calls are recorded.

The model is a scripted policy (allowed by the harness issue): it answers in vLLM's format with
the tiny tokenizer's ids, making each harness call its own file tool, then answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.harnesses import HARNESSES, model_harnesses
from infra.tasks import load_task
from openforge.testing.harness_cases import CASES
from openforge.testing.policy import Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, read_events
from orchestrator.rundir import Status
from schemas.enums import CompletionStatus
from tests.orchestrator.conftest import EXAMPLES, job


@pytest.mark.parametrize("name", model_harnesses())
def test_harness_solves_a_task_in_its_sandbox(
    name: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    harness = HARNESSES[name]()
    harness.executable()  # a SetupError naming `scripts/setup harnesses` if it is missing
    task = load_task(EXAMPLES / "write-file")
    case = CASES[name]
    # Absolute paths are the sandbox's: the workspace is the task's workdir there.
    arguments = json.loads(json.dumps(case.arguments).replace("{ws}", task.environment.workdir))
    policy = ScriptedPolicy(tiny_model_dir, Script(case.tool, arguments))
    with serving(policy) as url, job(tmp_path, harness, tiny_model_dir, upstream=url) as j:
        (record,) = j.run([task])
        j.proxy.flush()
        events = completions_of(read_events(j.proxy.config.log_url, want=2), record.rollout_id)
    root = j.out / "rollouts" / record.rollout_id
    assert record.status is Status.VERIFIED, record
    assert record.agent_phase == "finished", (root / "agent.err").read_text()[-3000:]
    assert record.reward == 1.0, (root / "verifier.out").read_text()
    assert (root / "workspace" / "hello.txt").read_text().strip() == "hello from openforge"
    # Every call went through the proxy and was recorded with the engine's tokens.
    assert len(events) >= 2 and all(e.status is CompletionStatus.OK for e in events)
    assert [e.call_index for e in events] == list(range(len(events)))
    assert all(e.completion_token_ids for e in events)
