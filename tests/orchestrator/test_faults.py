"""Faults injected into real rollouts (issue 53): the agent harness, real vLLM and real
sandboxes, with the proxy answering a share of the calls 503. The harness retries them (its
own retries, seen in its output), the rollouts end verified (an injected fault is never an
infrastructure failure the orchestrator retries), and the faulted calls are recorded as such."""

from __future__ import annotations

import json
from pathlib import Path

from infra.harnesses import Agent
from infra.local.vllm import VLLMServer
from infra.tasks import load_dataset
from openforge.testing.proxy import completions_of, read_events
from orchestrator.rundir import Status
from schemas.enums import CompletionStatus
from schemas.faults import FaultKind, FaultPlan
from tests.orchestrator.conftest import ROOT, job

TASKS = ROOT / "examples" / "tasks"


def test_injected_503s_are_retried_by_the_harness_and_recorded_never_retried_as_infra(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    tasks = load_dataset(TASKS)[:2]
    plan = FaultPlan({FaultKind.HTTP_503: 0.5}, seed=11, retry_after_s=0)
    agent = Agent(max_turns=2, max_tokens=8, retries=6)
    with job(
        tmp_path, agent, tiny_model_dir, upstream=vllm_server.base_url, max_attempts=2, faults=plan
    ) as j:
        records = j.run(tasks)
        j.proxy.flush()
        events = completions_of(read_events(j.proxy.config.log_url, want=4))
    assert [r.status for r in records] == [Status.VERIFIED] * len(tasks), records
    assert all(r.attempt == 1 for r in records)  # no rollout was retried for a fault
    faulted = [e for e in events if e.fault == FaultKind.HTTP_503.value]
    assert faulted, "seed 11 at rate 0.5 hits some call"
    assert all(e.status is CompletionStatus.UPSTREAM_ERROR for e in faulted)
    assert all(e.fault is None for e in events if e.status is CompletionStatus.OK)
    # The proxy saw each retry for what it is: the same call again (what the audit counts as
    # a fault the harness absorbed).
    assert {f.event_id for f in faulted} <= {e.retry_of for e in events if e.retry_of}
    # The harness saw each 503 and retried it (its own output says so).
    for record in records:
        hit = [e for e in faulted if e.rollout_id == record.rollout_id]
        out = j.out / "rollouts" / record.rollout_id / "agent.out"
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        retried = [x for x in lines if x.get("type") == "error" and x.get("retrying")]
        assert len(retried) == len(hit), (record.rollout_id, lines)
