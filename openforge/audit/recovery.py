"""Error recovery, read from the recorded calls: each tool call whose result was an error, what
the agent did next, and whether the rollout recovered.

A tool's result reaches the model in the next call's request (Chat Completions: a ``tool``
message; Responses: a ``function_call_output`` item; Anthropic Messages: a ``tool_result``
block), so each call's request is read for results not seen before in its rollout (by their
call id: a request in delta form holds only its new history, one in full form all of it). A
result is an error where the dialect flags it (``is_error``) or its text says so: a non-zero
``exit code``, ``Traceback``, ``command not found``, ``No such file or directory``, a line
starting ``error:``. What the agent did next is that call's own answer: the same tool call again
(**retried**), another tool call (**changed approach**), or an answer without one (**gave up**);
an error no call carried, because the harness stopped first, **ended the rollout**. A rollout
**recovered** when a later tool result of it succeeded; the time to recover is from the call
that carried the error to the one that carried that success. The recovery rate of a harness
(or a policy version) is the share of its rollouts with an error that still got a reward > 0.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from openforge.audit.queries import Query, Result, run

OUTCOMES = ("retried", "changed approach", "gave up", "ended the rollout")
_ERROR_TEXT = re.compile(
    r"exit code:?\s*[1-9]|exit_code\W+[1-9]|Traceback \(most recent call last\)|"
    r"command not found|No such file or directory|^error:",
    re.IGNORECASE | re.MULTILINE,
)

CALLS = Query(
    "recovery_calls",
    "The calls error recovery reads",
    "one row per call (not a side call) of a rollout: its request and response bodies, in order",
    """
    SELECT c.rollout_id, c.dialect, c.call_index, c.received_us, r.request_body, r.response_body
    FROM completions c JOIN raw.completion r USING (event_id)
    WHERE NOT c.side_call
    QUALIFY row_number() OVER (PARTITION BY c.event_id ORDER BY r.date) = 1
    ORDER BY c.rollout_id, c.call_index
    """,
)
ROLLOUTS = Query(
    "recovery_rollouts",
    "Each rollout's harness, policy version and reward",
    "one row per rollout with calls: its harness, the newest policy version of its tokens, and "
    "its latest reward (null: none)",
    """
    SELECT c.rollout_id, any_value(coalesce(c.harness, '?')) AS harness,
        max(list_max(c.policy_versions)) AS policy_version, any_value(r.reward) AS reward
    FROM completions c LEFT JOIN (
        SELECT rollout_id, arg_max(reward, at_us) AS reward FROM rewards GROUP BY rollout_id
    ) r USING (rollout_id)
    WHERE NOT c.side_call GROUP BY c.rollout_id
    """,
)
RECOVERY = Query(
    "error_recovery",
    "Error recovery, by harness and policy version",
    "one row per (harness, policy version): its rollouts, those with a tool error, the errors "
    "and what the agent did after each (retried the call, changed approach, gave up, ended the "
    "rollout), the recovery rate (rollouts with an error that still got a reward > 0) beside the "
    "mean reward of those with and without an error, and the mean seconds to recover",
    "-- computed in openforge/audit/recovery.py from the recovery_calls and recovery_rollouts "
    "queries",
)


@dataclass(frozen=True)
class ToolError:
    """One failed tool call of a rollout, and what followed it."""

    rollout_id: str
    tool: str
    then: str  # one of OUTCOMES
    recovered_after_s: float | None  # None: no later tool result of the rollout succeeded


def load_body(body: str | None) -> dict[str, Any]:
    """A recorded request or response body as JSON (an empty object where it is not one)."""
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c)
            for c in content
        )
    return "" if content is None else str(content)


def tool_results(dialect: str, request: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """``(call id, text, flagged as an error)`` of each tool result in a request's history."""
    out: list[tuple[str, str, bool]] = []
    if dialect == "chat":
        for m in request.get("messages") or []:
            if isinstance(m, dict) and m.get("role") == "tool":
                out.append((str(m.get("tool_call_id")), _text(m.get("content")), False))
    elif dialect == "responses":
        for item in request.get("input") or []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                out.append((str(item.get("call_id")), _text(item.get("output")), False))
    elif dialect == "messages":
        for m in request.get("messages") or []:
            for block in m.get("content") or [] if isinstance(m, dict) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    flag = bool(block.get("is_error"))
                    out.append((str(block.get("tool_use_id")), _text(block.get("content")), flag))
    return out


def tool_calls(dialect: str, response: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(call id, tool name, arguments as JSON text)`` of each tool call in a response."""
    out: list[tuple[str, str, str]] = []
    if dialect == "chat":
        for choice in response.get("choices") or []:
            for call in (choice.get("message") or {}).get("tool_calls") or []:
                fn = call.get("function") or {}
                out.append((str(call.get("id")), str(fn.get("name")), str(fn.get("arguments"))))
    elif dialect == "responses":
        for item in response.get("output") or []:
            if isinstance(item, dict) and item.get("type") == "function_call":
                out.append(
                    (str(item.get("call_id")), str(item.get("name")), str(item.get("arguments")))
                )
    elif dialect == "messages":
        for block in response.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                args = json.dumps(block.get("input"), sort_keys=True)
                out.append((str(block.get("id")), str(block.get("name")), args))
    return out


def is_error(text: str, flagged: bool) -> bool:
    """A tool result that reports a failure (see the module docstring)."""
    return flagged or bool(_ERROR_TEXT.search(text))


def _same(a: str, b: str) -> bool:
    """Two tool calls' arguments are the same call (as JSON values where they parse)."""
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return a == b


def rollout_errors(rollout_id: str, calls: Sequence[dict[str, Any]]) -> list[ToolError]:
    """The tool errors of one rollout, from its calls in order (see the module docstring)."""
    made: dict[str, tuple[str, str]] = {}  # call id -> (tool, arguments), as the model made it
    seen: set[str] = set()
    found: list[tuple[int, str, str, float]] = []  # (call, tool, what next, when carried)
    recovered: dict[int, float] = {}  # error -> seconds until a later result succeeded
    for i, call in enumerate(calls):
        dialect = str(call["dialect"])
        at = float(call["received_us"]) / 1e6
        answer = tool_calls(dialect, load_body(call["response_body"]))
        results = tool_results(dialect, load_body(call["request_body"]))
        new = [r for r in results if r[0] not in seen]
        seen.update(r[0] for r in new)
        for call_id, text, flagged in new:
            tool, args = made.get(call_id, ("?", ""))
            if is_error(text, flagged):
                again = any(c[1] == tool and _same(c[2], args) for c in answer)
                then = "retried" if again else "changed approach" if answer else "no tool call"
                found.append((i, tool, then, at))
            else:
                for k, (_, _, _, when) in enumerate(found):
                    recovered.setdefault(k, at - when)
        made.update({c[0]: (c[1], c[2]) for c in answer})
    last = len(calls) - 1
    return [
        ToolError(
            rollout_id,
            tool,
            then if then != "no tool call" else "ended the rollout" if i == last else "gave up",
            recovered.get(k),
        )
        for k, (i, tool, then, _) in enumerate(found)
    ]


def analyse(calls: Result) -> list[ToolError]:
    """Every rollout's tool errors, from the ``recovery_calls`` query's rows."""
    rows = [dict(zip(calls.columns, row, strict=True)) for row in calls.rows]
    by_rollout: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_rollout.setdefault(str(row["rollout_id"]), []).append(row)
    return [e for rid, rs in by_rollout.items() for e in rollout_errors(rid, rs)]


def recovery(con: duckdb.DuckDBPyConnection) -> Result:
    """The error-recovery table of a run (:data:`RECOVERY`)."""
    rollouts = run(con, ROLLOUTS).rows
    key_of = {str(rid): (str(harness), version) for rid, harness, version, _ in rollouts}
    reward = {str(rid): float(r) for rid, _, _, r in rollouts if r is not None}
    return Result(RECOVERY, COLUMNS, _table(key_of, analyse(run(con, CALLS)), reward))


COLUMNS = [
    "harness", "policy_version", "rollouts", "with_errors", "errors", *OUTCOMES,
    "recovery_rate", "reward_with_errors", "reward_without", "recover_s",
]  # fmt: skip


def _table(
    key_of: dict[str, tuple[str, int | None]], errors: Iterable[ToolError], reward: dict[str, float]
) -> list[tuple[Any, ...]]:
    by_key: dict[tuple[str, int | None], list[str]] = {}
    for rid, key in key_of.items():
        by_key.setdefault(key, []).append(rid)
    failed: dict[str, list[ToolError]] = {}
    for e in errors:
        failed.setdefault(e.rollout_id, []).append(e)
    rows = []
    for key in sorted(by_key, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        rids = by_key[key]
        erring = [r for r in rids if r in failed]
        clean = [r for r in rids if r not in failed]
        kinds = Counter(e.then for r in erring for e in failed[r])
        times = [
            e.recovered_after_s
            for r in erring
            for e in failed[r]
            if e.recovered_after_s is not None
        ]
        scored = [r for r in erring if r in reward]
        rows.append((
            *key, len(rids), len(erring), sum(kinds.values()), *(kinds[o] for o in OUTCOMES),
            sum(reward[r] > 0 for r in scored) / len(scored) if scored else None,
            _mean([reward[r] for r in scored]), _mean([reward[r] for r in clean if r in reward]),
            _mean(times),
        ))  # fmt: skip
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
