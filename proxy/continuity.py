"""Token continuity: which thread a call belongs to, how its history relates to that thread's
last call, and the prompt token ids to send upstream.

When a request resends the history this rollout's thread recorded (the last call's messages plus
the assistant turn we answered), the prompt is the last call's prompt + completion ids exactly,
followed by the rendering of only the new messages (token-in). Otherwise the prompt is rendered in
full and the mismatch is classified. Generated tokens are never re-derived from text.

A call with an image is rendered by the engine (:mod:`proxy.upstream_chat`): its plan is made
from its messages alone (``engine``; no prompt ids yet), and when the engine reports the prompt
ids it used, :meth:`Plan.settle_engine_prompt` checks them: a call whose messages extend the
thread's is EXACT only if those ids start with the previous prompt and completion exactly
(else REWRITTEN: the engine re-tokenized the history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical import CallRequest, Generation, Message
from proxy.images import has_images
from proxy.render import Renderer, leading_system
from schemas.delta import common_prefix
from schemas.enums import CompletionStatus, ContinuityClass


@dataclass(slots=True)
class LastCall:
    """What a thread remembers of its latest call."""

    event_id: str
    messages: list[Message]
    tools: list[dict[str, Any]]  # compared by value: a changed tool list is no continuation
    assistant: Message | None  # what we answered; None if nothing was generated
    prompt_ids: list[int]
    completion_ids: list[int]
    status: CompletionStatus

    def expected(self) -> list[Message]:
        """The history a harness resends next: these messages plus our answer."""
        return self.messages + ([self.assistant] if self.assistant is not None else [])


@dataclass(slots=True)
class Thread:
    thread_id: str
    side_call: bool
    last: LastCall | None = None


@dataclass(slots=True)
class Plan:
    """The decision for one call, made before it goes upstream."""

    thread: Thread
    continuity: ContinuityClass
    prompt_ids: list[int]
    retry_of: str | None = None
    parent_event_id: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    rendered: bool = True  # False when the prompt reuses recorded ids (token-in)
    engine: bool = False  # the engine renders the prompt (images): its ids come back later
    expected_prefix: list[int] | None = None  # engine calls: what an EXACT prompt starts with

    def settle_engine_prompt(self, ids: list[int]) -> None:
        """The prompt ids the engine used for this (engine-rendered) call, checked against
        the thread: an EXACT call whose ids do not extend the previous ones is REWRITTEN."""
        self.prompt_ids = list(ids)
        prefix = self.expected_prefix
        if self.continuity is ContinuityClass.EXACT and (
            prefix is None or ids[: len(prefix)] != prefix
        ):
            self.continuity = ContinuityClass.REWRITTEN


def rewrites_failed(messages: list[Message], last: LastCall) -> bool:
    """A failed turn resent with its user text rewritten, everything else equal (OpenClaw wraps
    the prompt in a "continue the interrupted task" note when it retries)."""
    if last.status is CompletionStatus.OK or len(messages) != len(last.messages):
        return False
    diff = [i for i, (a, b) in enumerate(zip(messages, last.messages, strict=True)) if a != b]
    if not diff:
        return False
    if diff == [len(messages) - 1]:
        return True  # only the last message changed
    return len(diff) <= 2 and all(
        messages[i].get("role") == "user" == last.messages[i].get("role") for i in diff
    )


def classify(messages: list[Message], expected: list[Message]) -> ContinuityClass:
    """Why ``messages`` is not an extension of ``expected`` (best effort, for audits)."""
    k = common_prefix(messages, expected)
    rest_m, rest_e = messages[k:], expected[k:]
    if k <= leading_system(messages):
        shorter = len(messages) < len(expected)
        return ContinuityClass.COMPACTED if shorter else ContinuityClass.UNRELATED
    if not rest_e:
        return ContinuityClass.REWRITTEN  # same history, but the tools or the template changed
    nxt = rest_e[0]
    if nxt in rest_m[1:]:
        return ContinuityClass.INJECTED  # something was inserted before the expected message
    if rest_m and rest_m[0].get("role") == nxt.get("role"):
        if rest_m[0] in rest_e[1:]:
            return ContinuityClass.DROPPED
        return ContinuityClass.REWRITTEN  # the same turn, modified
    if len(messages) < len(expected) // 2:
        return ContinuityClass.COMPACTED
    return ContinuityClass.DROPPED


def _extends(msgs: list[Message], tools: list[dict[str, Any]], last: LastCall) -> bool:
    """``msgs`` resend ``last``'s history and our answer, then add to it (same tools)."""
    expected = last.expected()
    return (
        last.assistant is not None
        and last.status is CompletionStatus.OK
        and tools == last.tools
        and len(msgs) > len(expected)
        and msgs[: len(expected)] == expected
    )


@dataclass
class ContinuityTracker:
    """Per-rollout thread state. Not thread-safe: the caller serialises plan and commit."""

    rollout_id: str
    threads: list[Thread] = field(default_factory=list)
    main_model: str | None = None
    last_event_id: str | None = None

    def _match(self, messages: list[Message]) -> Thread | None:
        head = leading_system(messages)
        best, score = None, head
        for thread in self.threads:
            if thread.last is None:
                continue
            s = max(
                common_prefix(messages, thread.last.expected()),
                common_prefix(messages, thread.last.messages),
            )
            if s > score:
                best, score = thread, s
        if best is None:  # no shared history: perhaps a failed turn with its prompt rewritten
            for thread in reversed(self.threads):
                if thread.last is not None and rewrites_failed(messages, thread.last):
                    return thread
        return best

    def plan(self, req: CallRequest, renderer: Renderer) -> Plan:
        """The call's plan: the thread it continues (a new one if it continues none), how it
        relates to that thread's last call, and its prompt ids."""
        if self.main_model is None and req.tools:
            self.main_model = req.model
        thread = self._match(req.messages)
        engine = has_images(req.messages)

        def render() -> list[int]:  # the engine's call: its ids are known once it answers
            return [] if engine else renderer.prompt_ids(req.messages, req.tools)

        if thread is None or thread.last is None:
            plan = self._new_thread(req, render)
        elif engine:
            plan = self._next_engine_call(thread, thread.last, req)
        else:
            plan = self._next_call(thread, thread.last, req, renderer)
        plan.engine = engine
        return plan

    def _new_thread(self, req: CallRequest, render: Callable[[], list[int]]) -> Plan:
        """A call that continues no thread: a first call, a compacted conversation, a sub-agent
        or a side call (another model, or no tools once the main model is known)."""
        msgs = req.messages
        side = (self.main_model is not None and req.model != self.main_model) or (
            not req.tools and self.main_model is not None
        )
        continuity = ContinuityClass.FIRST
        recent = next((t for t in reversed(self.threads) if not t.side_call and t.last), None)
        if not side and recent is not None and recent.last is not None:
            # Same system prompt, fewer messages than the history it replaces: the harness
            # compacted the conversation. Other new threads are sub-agents.
            expected, head = recent.last.expected(), leading_system(msgs)
            if head and msgs[:head] == expected[:head] and len(msgs) < len(expected):
                continuity = ContinuityClass.COMPACTED
        thread = Thread(f"{self.rollout_id}/t{len(self.threads)}", side_call=side)
        self.threads.append(thread)
        parent = self.last_event_id if len(self.threads) > 1 and not side else None
        return Plan(thread, continuity, render(), parent_event_id=parent, tools=req.tools)

    def _next_engine_call(self, thread: Thread, last: LastCall, req: CallRequest) -> Plan:
        """A call in ``thread`` that the engine renders: classified by its messages; an exact
        continuation must prove it by its ids later (:meth:`Plan.settle_engine_prompt`)."""
        msgs, tools = req.messages, req.tools
        if msgs == last.messages or rewrites_failed(msgs, last):
            return Plan(thread, ContinuityClass.RETRY, [], retry_of=last.event_id, tools=tools)
        if _extends(msgs, tools, last):
            prefix = [*last.prompt_ids, *last.completion_ids]
            return Plan(thread, ContinuityClass.EXACT, [], tools=tools, expected_prefix=prefix)
        return Plan(thread, classify(msgs, last.expected()), [], tools=tools)

    def _next_call(
        self, thread: Thread, last: LastCall, req: CallRequest, renderer: Renderer
    ) -> Plan:
        """A call in ``thread``: a retry of its last call, its exact continuation (the last
        prompt and completion ids reused, only the new messages rendered) or, rendered in full,
        a mismatch classified."""
        msgs, tools = req.messages, req.tools

        def rendered() -> list[int]:
            return renderer.prompt_ids(msgs, tools)

        if msgs == last.messages:  # the same turn again
            same_tools = tools == last.tools
            return Plan(
                thread,
                ContinuityClass.RETRY,
                list(last.prompt_ids) if same_tools else rendered(),
                retry_of=last.event_id,
                tools=tools,
                rendered=not same_tools,
            )
        if rewrites_failed(msgs, last):  # a failed turn, resent with a rewritten prompt
            return Plan(
                thread,
                ContinuityClass.RETRY,
                rendered(),
                retry_of=last.event_id,
                tools=tools,
            )
        expected = last.expected()
        if _extends(msgs, tools, last):
            assert last.assistant is not None  # it extends our answer
            suffix = renderer.continuation(
                last.messages, last.assistant, last.completion_ids, msgs, tools
            )
            if suffix is not None:
                return Plan(
                    thread,
                    ContinuityClass.EXACT,
                    [*last.prompt_ids, *last.completion_ids, *suffix],
                    tools=tools,
                    rendered=False,
                )
            return Plan(thread, ContinuityClass.REWRITTEN, rendered(), tools=tools)
        return Plan(thread, classify(msgs, expected), rendered(), tools=tools)

    def commit(
        self, plan: Plan, event_id: str, req: CallRequest, gen: Generation, status: CompletionStatus
    ) -> None:
        """Remember the call as its thread's latest."""
        generated = bool(gen.token_ids) and status is CompletionStatus.OK
        plan.thread.last = LastCall(
            event_id=event_id,
            messages=req.messages,
            tools=plan.tools,
            assistant=gen.assistant_message() if generated else None,
            prompt_ids=plan.prompt_ids,
            completion_ids=list(gen.token_ids),
            status=status,
        )
        self.last_event_id = event_id
