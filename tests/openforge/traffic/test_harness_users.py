"""Real harnesses as simulated users (openforge.traffic.harness_users): Codex CLI and Claude Code,
unmodified, pointed at a real proxy in open mode in front of a real vLLM, each play a session
that nobody registered; the proxy records it into the rollout their own session header names,
ends it when idle, and the simulated person's late feedback finds it by the session id the
harness reported. OpenClaw, which reports no id its calls carry, is refused as a user."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from openforge.traffic.dialects import Dialect
from openforge.traffic.ledger import rollout_of
from openforge.traffic.simulate import TrafficConfig, plans, run
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus, RolloutPhase
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

FEEDBACK = "fb-users"


def test_real_harnesses_play_sessions_and_get_late_feedback_by_their_own_ids(
    long_vllm: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(
        long_vllm.base_url, tmp_path, open_mode=True, session_idle_timeout=1.0,
        feedback_token=FEEDBACK, max_tokens_cap=48,
    )  # fmt: skip
    with running_proxy(config) as proxy:
        report = run(
            TrafficConfig(
                proxy.url, users=2, sessions=2, dialects=(), harnesses=("codex", "claude-code"),
                feedback_fraction=1.0, feedback_delay_s=(2.0, 3.0), feedback_token=FEEDBACK,
                harness_root=tmp_path / "users", harness_timeout_s=240,
            )
        )  # fmt: skip
        proxy.flush()
    counts = report.counts()
    assert counts["harness_sessions"] == 2 and counts["harness_sessions_failed"] == 0, [
        r.errors for r in report.results
    ]
    assert counts["feedback_posted"] == 2 and counts["feedback_failed"] == 0, counts
    records = read_events(config.log_url, want=1)
    speaks = {"codex": Dialect.RESPONSES, "claude-code": Dialect.MESSAGES}
    for result in report.results:
        rollout = rollout_of(result)  # the session id the harness reported names its rollout
        assert result.plan.harness is not None and not result.plan.session.startswith("sim-")
        calls = [r for r in records if isinstance(r, CompletionEvent) and r.rollout_id == rollout]
        assert calls and all(c.status is CompletionStatus.OK for c in calls), result.plan
        assert {c.dialect.value for c in calls} == {speaks[result.plan.harness].value}
        ours = [r for r in records if r.rollout_id == rollout]
        phases = [r.phase for r in ours if isinstance(r, RolloutEvent)]
        assert phases == [RolloutPhase.STARTED, RolloutPhase.FINISHED]  # ended when idle
        rewards = [r for r in ours if isinstance(r, RewardEvent)]
        assert [(r.verifier, r.reward) for r in rewards] == [("feedback", result.judged())]
        assert result.judged() in (0.0, 0.5, 1.0)


def test_harness_sessions_take_turns_with_the_dialects() -> None:
    cfg = TrafficConfig("http://p", sessions=6, harnesses=("codex",), tag="t")
    players = [p.harness or p.dialect.value for p in plans(cfg)]
    assert players == ["chat", "responses", "messages", "codex"] * 1 + ["chat", "responses"]
    assert all(not p.by_response for p in plans(cfg) if p.harness)


def test_a_harness_that_reports_no_session_it_calls_under_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be a simulated user"):
        TrafficConfig("http://127.0.0.1:1", harnesses=("openclaw",))
    with pytest.raises(ConfigError, match="at least one dialect or harness"):
        TrafficConfig("http://127.0.0.1:1", dialects=())
