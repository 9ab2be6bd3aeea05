"""The audit's injected-faults query (issue 53) over an archive with known faults: a refused
call the harness retried, a refusal it did not retry, and a slow answer; calls without a
fault are not counted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from openforge.audit.fault_queries import INJECTED_FAULTS
from openforge.audit.queries import run
from openforge.query.views import open_views
from openforge.testing.rollouts import make_rollout
from schemas.archive import ArchiveWriter
from schemas.codec import Record
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus


def _refused(event: CompletionEvent, event_id: str, kind: str) -> CompletionEvent:
    return replace(
        event,
        event_id=event_id,
        status=CompletionStatus.UPSTREAM_ERROR,
        fault=kind,
        completion_token_ids=[],
        completion_logprobs=[],
        policy_versions=[],
    )


def test_each_fault_is_counted_by_harness_and_kind_with_the_harness_retries(
    tmp_path: Path,
) -> None:
    rollout = make_rollout(3, "r1", calls=4)
    calls = list(
        {r.event_id: r for r in rollout.records if isinstance(r, CompletionEvent)}.values()
    )
    ok = [c for c in calls if c.status is CompletionStatus.OK and c.retry_of is None]
    first, second, third = ok[:3]
    records: list[Record] = [r for r in rollout.records if not isinstance(r, CompletionEvent)]
    records += [c for c in calls if c not in (first, second, third)]
    records += [
        _refused(first, "f-retried", "http_503"),
        replace(first, retry_of="f-retried"),  # the harness's retry of the refused call
        _refused(second, "f-given-up", "http_503"),
        second,
        replace(third, fault="slow_first_byte"),  # answered late but whole: nothing to retry
    ]
    ArchiveWriter(tmp_path / "archive").write(records)
    result = run(open_views(tmp_path / "archive"), INJECTED_FAULTS)
    rows = {(r[0], r[1]): r[2:] for r in result.rows}
    harness = first.harness or "?"
    reward = rollout.reward
    assert rows[(harness, "http_503")][:4] == (2, 1, 1, 1)  # fired, retried, not, retries
    assert rows[(harness, "slow_first_byte")][:4] == (1, 0, 1, 0)
    assert all(r[4] == reward for r in rows.values())
    assert set(rows) == {(harness, "http_503"), (harness, "slow_first_byte")}
