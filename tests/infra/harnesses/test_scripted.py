"""Multi-turn rollouts of each real harness against a scripted model policy (issue 5 allows it).

The script makes the harness call one of its own tools (write a file), then answers. Checked: the
tool really ran in the rollout's workspace, and the recorded events have the right count, order,
call indexes, continuity classes and tokens. With one stream dropped mid-answer, the harness's
retry is recorded as ``retry_of`` the failed attempt, not as a new turn.
"""

from __future__ import annotations

import json
from pathlib import Path

from infra.harnesses import Harness
from infra.harnesses.runner import RolloutResult, run_rollout
from openforge.testing.harness_cases import CASES, CONTENT, TASK
from openforge.testing.policy import LOGPROB, Script, ScriptedPolicy, serving
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus, ContinuityClass, RolloutPhase


def run_scripted(
    harness: Harness, tiny_model_dir: Path, tmp_path: Path, drop: bool
) -> tuple[RolloutResult, list[CompletionEvent], ScriptedPolicy]:
    case = CASES[harness.name]
    rollout_id = f"{harness.name}-scripted"
    workspace = tmp_path / "rollouts" / rollout_id / "workspace"
    arguments = json.loads(json.dumps(case.arguments).replace("{ws}", str(workspace)))
    policy = ScriptedPolicy(tiny_model_dir, Script(case.tool, arguments, drop_stream_once=drop))
    with serving(policy) as url:
        config = proxy_config(url, tmp_path)
        with running_proxy(config) as proxy:
            result = run_rollout(
                harness,
                TASK,
                proxy.url,
                tmp_path / "rollouts",
                rollout_id=rollout_id,
                timeout_s=180,
                admin_token=proxy.config.admin_token,
            )
            proxy.flush()
    events = completions_of(read_events(config.log_url), rollout_id)
    assert result.dirs.workspace == workspace
    return result, events, policy


def session(events: list[CompletionEvent]) -> list[CompletionEvent]:
    """The calls of the thread the rollout ended in: not side calls, nor a call the harness
    made before its session in a thread of its own (OpenCode asks for a title first, with no
    tools, before the proxy knows the main model)."""
    return [e for e in events if e.thread_id == events[-1].thread_id and not e.side_call]


def assert_clean_finish(result: RolloutResult) -> None:
    assert result.phase is RolloutPhase.FINISHED, (result.stdout[-2000:], result.stderr[-2000:])
    assert result.exit_code == 0
    assert result.leftovers() == []
    assert result.report.final_message == "Done: the file is written."
    assert result.report.session_id


def test_tool_call_then_answer(harness: Harness, tiny_model_dir: Path, tmp_path: Path) -> None:
    result, events, policy = run_scripted(harness, tiny_model_dir, tmp_path, drop=False)
    assert_clean_finish(result)
    assert (result.dirs.workspace / "hello.txt").read_text().strip() == CONTENT.strip()

    case = CASES[harness.name]
    assert [e.call_index for e in events] == list(range(len(events)))
    main = session(events)
    assert [(e.status, e.continuity) for e in main] == [
        (CompletionStatus.OK, ContinuityClass.FIRST),
        (CompletionStatus.OK, case.follow_up),
    ]
    assert [c.kind for c in policy.calls if c.kind != "side"] == ["tool_call", "final"]
    first, second = main
    assert second.thread_id == first.thread_id and second.retry_of is None
    for event in main:
        assert event.dialect is harness.dialect and event.streamed
        assert event.completion_logprobs == [LOGPROB] * len(event.completion_token_ids)
        assert event.completion_token_ids[-1] == policy.end_id
    call = policy.tokenizer.decode(first.completion_token_ids, skip_special_tokens=True)
    assert json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["name"] == case.tool
    if case.follow_up is ContinuityClass.EXACT:
        # Token-in: the second prompt is the first prompt + completion, extended.
        assert second.prompt_ref_event_id == first.event_id
        assert second.prompt_ref_tokens == first.prompt_length + len(first.completion_token_ids)


def test_dropped_stream_is_recorded_as_a_retry(
    harness: Harness, tiny_model_dir: Path, tmp_path: Path
) -> None:
    result, events, policy = run_scripted(harness, tiny_model_dir, tmp_path, drop=True)
    case = CASES[harness.name]
    main = session(events)
    assert [c.dropped for c in policy.calls].count(True) == 1
    assert [e.call_index for e in events] == list(range(len(events)))
    if not case.retries_broken:  # recorded as it happened: one failed call, the run failed
        assert result.phase is RolloutPhase.FAILED and result.leftovers() == []
        (failed,) = main
        assert failed.status is CompletionStatus.UPSTREAM_ERROR
        assert "broke off" in (failed.error or "")
        return
    assert_clean_finish(result)
    assert (result.dirs.workspace / "hello.txt").read_text().strip() == CONTENT.strip()
    assert [(e.status, e.continuity) for e in main] == [
        (CompletionStatus.UPSTREAM_ERROR, ContinuityClass.FIRST),
        (CompletionStatus.OK, ContinuityClass.RETRY),
        (CompletionStatus.OK, case.follow_up),
    ]
    failed, retry, final = main
    assert failed.error and "broke off" in failed.error
    assert 0 < len(failed.completion_token_ids) < len(retry.completion_token_ids)
    assert retry.retry_of == failed.event_id and retry.thread_id == failed.thread_id
    assert final.retry_of is None and final.thread_id == failed.thread_id
    assert retry.streamed is case.retry_streams
    if case.follow_up is ContinuityClass.EXACT:
        assert final.prompt_ref_event_id == retry.event_id
