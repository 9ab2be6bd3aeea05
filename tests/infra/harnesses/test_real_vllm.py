"""A harness, unmodified, runs a task through the proxy against real vLLM, and what is recorded
of its calls is the engine's own: vLLM scores each recorded token of the harness's real prompt
with the recorded logprob.

The tiny model answers noise, so what a harness does with the answer is up to it; what is checked
is the recording and a clean end. Here the built-in agent (Chat Completions) and Codex CLI
(Responses, a real harness's long prompts). Claude Code and OpenClaw run through the same path in
the README's `openforge rollouts run --harness claude-code|openclaw` (tests/readme), where their
recording is checked by tests/infra/harnesses/recording.py (numbering, dialect, prompts rebuilt
to their length, the cap); that the proxy records the engine's exact ids and logprobs in their
dialects (Anthropic Messages, Chat Completions) is tests/proxy/test_calls.py's. Both ran here
before (155 s and 66 s of the suite in CI).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from infra.harnesses.runner import run_rollout
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, RolloutPhase
from schemas.rollout import RolloutEvent
from tests.infra.harnesses.conftest import installed
from tests.infra.harnesses.recording import check_calls
from tests.trainer.test_weight_sync import _vllm_logprobs

TASK = "Create a file named hello.txt containing the word hello."
MAX_TOKENS = 48  # per call: the harnesses ask for up to 32k tokens; noise need not be long


@pytest.mark.parametrize("name", ["agent", "codex"])
def test_harness_runs_through_the_proxy_on_real_vllm(
    name: str, long_vllm: VLLMServer, tmp_path: Path
) -> None:
    harness = installed(name)
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

    assert check_calls(records, result.rollout_id, harness, MAX_TOKENS) > 0
    events = completions_of(records, result.rollout_id)

    # The recorded ids are the engine's: vLLM scores each recorded token with the recorded logprob.
    rebuild = Reconstructor()
    for event in events:
        prompt = rebuild.prompt(event)
        if event.status is not CompletionStatus.OK or event.sampling.temperature not in (None, 1):
            continue  # (lengths and the cap: check_calls above)
        # vLLM's logprob of each recorded token after its prompt (scored, not sampled).
        full = prompt + event.completion_token_ids
        scored = _vllm_logprobs(long_vllm, "tiny", full)[len(prompt) - 1 :]
        for got, want in zip(event.completion_logprobs, scored, strict=True):
            assert math.isclose(got, want, abs_tol=2e-3), (got, want)
