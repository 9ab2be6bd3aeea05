"""Each real harness, unmodified, runs a task through the proxy against real vLLM.

The tiny model answers noise, so what a harness does with the answer is up to it; what is checked
is the recording: the engine's own token ids and logprobs, and a clean end.
"""

from __future__ import annotations

import math
from pathlib import Path

from infra.harnesses import Harness
from infra.harnesses.runner import run_rollout
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, RolloutPhase
from schemas.rollout import RolloutEvent
from tests.trainer.test_weight_sync import _vllm_logprobs

TASK = "Create a file named hello.txt containing the word hello."
MAX_TOKENS = 48  # per call: the harnesses ask for up to 32k tokens; noise need not be long


def test_harness_runs_through_the_proxy_on_real_vllm(
    harness: Harness, long_vllm: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(long_vllm.base_url, tmp_path, max_tokens_cap=MAX_TOKENS)
    with running_proxy(config) as proxy:
        result = run_rollout(
            harness,
            TASK,
            proxy.url,
            tmp_path / "rollouts",
            timeout_s=240,
            admin_token=proxy.config.admin_token,
        )
        proxy.flush()
    records = read_events(config.log_url)

    # The harness ended on its own, in time, and left nothing running.
    assert result.phase is not RolloutPhase.TIMED_OUT, result.stderr[-2000:]
    assert result.exit_code is not None
    assert result.leftovers() == []
    assert result.report.session_id, result.stdout[-2000:]
    phases = [(r.phase, r.exit_code, r.harness) for r in records if isinstance(r, RolloutEvent)]
    assert phases == [
        (RolloutPhase.STARTED, None, harness.name),
        (result.phase, result.exit_code, harness.name),
    ]

    events = completions_of(records, result.rollout_id)
    ok = [e for e in events if e.status is CompletionStatus.OK]
    assert ok, f"no completion recorded; harness said: {result.stdout[-2000:]}"
    assert [e.call_index for e in events] == list(range(len(events)))
    assert all(e.dialect is harness.dialect and e.harness == harness.name for e in events)

    # The recorded ids are the engine's: vLLM scores each recorded token with the recorded logprob.
    rebuild = Reconstructor()
    for event in events:
        prompt = rebuild.prompt(event)
        if event.status is not CompletionStatus.OK or event.sampling.temperature not in (None, 1):
            continue
        assert len(prompt) == event.prompt_length
        assert 0 < len(event.completion_token_ids) <= MAX_TOKENS
        # vLLM's logprob of each recorded token after its prompt (scored, not sampled).
        full = prompt + event.completion_token_ids
        scored = _vllm_logprobs(long_vllm, "tiny", full)[len(prompt) - 1 :]
        for got, want in zip(event.completion_logprobs, scored, strict=True):
            assert math.isclose(got, want, abs_tol=2e-3), (got, want)
