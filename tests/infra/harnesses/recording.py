"""What a real harness's rollouts must leave in the event log, whoever ran them: checked on the
README's `openforge rollouts run --harness codex|claude-code|openclaw` runs (tests/readme) and
on single rollouts through the proxy (test_real_vllm.py)."""

from __future__ import annotations

from pathlib import Path

from infra.harnesses import Harness
from openforge.testing.proxy import completions_of, read_events
from orchestrator.rundir import RunDir, Status
from schemas.codec import Record
from schemas.delta import Reconstructor
from schemas.enums import TERMINAL_PHASES, CompletionStatus, RolloutPhase
from schemas.rollout import RolloutEvent

# The orchestrator's lifecycle of a rollout that played and was verified.
PLAYED = [RolloutPhase.QUEUED, RolloutPhase.STARTED]


def check_calls(records: list[Record], rollout_id: str, harness: Harness, max_tokens: int) -> int:
    """The rollout's completion events: numbered from 0 without a gap, in the harness's dialect
    and named for it, at least one answered, each prompt rebuilt from the recorded deltas to its
    recorded length, each generation within the cap. Returns how many calls it made."""
    events = completions_of(records, rollout_id)
    assert any(e.status is CompletionStatus.OK for e in events), f"{rollout_id}: no answered call"
    assert [e.call_index for e in events] == list(range(len(events)))
    assert all(e.dialect is harness.dialect and e.harness == harness.name for e in events)
    rebuild = Reconstructor()
    for event in events:
        prompt = rebuild.prompt(event)
        if event.status is CompletionStatus.OK:
            assert len(prompt) == event.prompt_length
            assert 0 < len(event.completion_token_ids) <= max_tokens
            assert len(event.completion_logprobs) == len(event.completion_token_ids)
    return len(events)


def check_rollouts_run(
    run: Path, harness: Harness, max_tokens: int, log: Path | None = None
) -> None:
    """A `rollouts run` directory (its embedded log under services/, or ``log``: where several
    harnesses shared one): every rollout verified, its lifecycle queued -> started -> its own
    end -> verified, all named for the harness, its calls as :func:`check_calls` says and as
    many as its outcome counts."""
    outcomes = RunDir(run).outcomes()
    assert outcomes and all(o.status is Status.VERIFIED for o in outcomes), outcomes
    records = read_events(f"local:{log or run / 'services' / 'log'}", want=1)
    for outcome in outcomes:
        rid = outcome.rollout_id
        lifecycle = [r for r in records if isinstance(r, RolloutEvent) and r.rollout_id == rid]
        phases = [r.phase for r in lifecycle]  # in the order they were published
        assert phases[:2] == PLAYED and phases[2] in TERMINAL_PHASES, (rid, phases)
        assert phases[3:] == [RolloutPhase.VERIFIED], (rid, phases)
        assert {r.harness for r in lifecycle} == {harness.name}
        assert check_calls(records, rid, harness, max_tokens) == outcome.calls
