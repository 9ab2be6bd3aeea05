"""Delta form of prompts and request histories, so storage grows linearly with a rollout.

A harness resends the whole history every turn. A :class:`CompletionEvent` therefore stores its
prompt as (earlier call, number of that call's prompt + completion tokens reused, new suffix), and
its request body's history list as (earlier call, number of that call's history items reused, body
with only the new items). :class:`DeltaEncoder` builds that form as events are recorded;
:class:`Reconstructor` rebuilds the full form from a rollout's events in call order.

Request bodies round-trip as JSON values (``json.loads`` equal), not byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a schemas-only install
    orjson = None  # type: ignore[assignment]

from schemas.completion import CompletionEvent
from schemas.enums import Dialect
from schemas.errors import SchemaError

# The request field that holds the resent conversation, per dialect.
HISTORY_KEYS = {Dialect.CHAT: "messages", Dialect.RESPONSES: "input", Dialect.MESSAGES: "messages"}


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of two sequences.

    Compares slices (in C) and bisects to the first difference, so a 30k-token prompt that
    extends the previous one costs one list comparison instead of a Python loop per token.
    """
    n = min(len(a), len(b))
    if type(a) is not type(b) or not isinstance(a, list | tuple | str):
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; they differ before hi
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


def dump_json(value: Any) -> str:
    """Compact JSON text, UTF-8 as is; orjson where installed (the proxy's extra: several
    times faster on a harness's tools and system prompt), else the standard library."""
    if orjson is not None:
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # what orjson does not take (an integer past 64 bits): the slow way
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class PromptDelta:
    ref_event_id: str | None
    ref_tokens: int
    suffix: list[int]


@dataclass(frozen=True, slots=True)
class HistoryDelta:
    ref_event_id: str | None
    prefix: int
    body_json: str


def delta_prompt(prompt: Sequence[int], base: tuple[str, Sequence[int]] | None) -> PromptDelta:
    """``prompt`` relative to ``base`` = (event id, that call's prompt + completion tokens)."""
    if base is not None:
        n = common_prefix(prompt, base[1])
        if n:
            return PromptDelta(base[0], n, list(prompt[n:]))
    return PromptDelta(None, 0, list(prompt))


Scrub = Callable[[dict[str, Any]], dict[str, Any]]


def delta_body(
    body: dict[str, Any],
    dialect: Dialect,
    base: tuple[str, Sequence[Any]] | None,
    scrub: Scrub | None = None,
) -> HistoryDelta:
    """``body`` with its history list relative to ``base`` = (event id, that call's history).

    ``scrub`` (e.g. redaction) is applied to what is stored: the body with only the new history
    items. It must be deterministic, so that a history stored in pieces reads back the same as
    one scrubbed whole."""
    key = HISTORY_KEYS[dialect]
    history = body.get(key)
    stored = body
    ref: str | None = None
    n = 0
    if base is not None and isinstance(history, list):
        n = common_prefix(history, base[1])
        if n:
            ref, stored = base[0], {**body, key: history[n:]}
    return HistoryDelta(ref, n, dump_json(scrub(stored) if scrub is not None else stored))


class DeltaEncoder:
    """Turns full prompts and bodies into delta form against the previous call of each thread.

    Keeps, per thread key, the last call's event id, prompt + completion tokens and request
    history: memory is one context per live thread. Call :meth:`forget` when a rollout ends.
    """

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, list[int]]] = {}
        self._history: dict[str, tuple[str, list[Any]]] = {}

    def encode(
        self,
        thread_key: str,
        event_id: str,
        dialect: Dialect,
        prompt: Sequence[int],
        completion: Sequence[int],
        body: dict[str, Any] | None,
        scrub: Scrub | None = None,
    ) -> tuple[PromptDelta, HistoryDelta | None]:
        pdelta = delta_prompt(prompt, self._tokens.get(thread_key))
        self._tokens[thread_key] = (event_id, [*prompt, *completion])
        hdelta = None
        if body is not None:
            hdelta = delta_body(body, dialect, self._history.get(thread_key), scrub)
            history = body.get(HISTORY_KEYS[dialect])
            if isinstance(history, list):
                self._history[thread_key] = (event_id, history)
        return pdelta, hdelta

    def forget(self, thread_key: str) -> None:
        self._tokens.pop(thread_key, None)
        self._history.pop(thread_key, None)


class Reconstructor:
    """Rebuilds full prompts and request bodies; feed a rollout's events in call order."""

    def __init__(self) -> None:
        self._tokens: dict[str, list[int]] = {}  # event id -> prompt + completion
        self._history: dict[str, list[Any]] = {}  # event id -> request history

    def _ref_tokens(self, event: CompletionEvent) -> list[int]:
        assert event.prompt_ref_event_id is not None
        base = self._tokens.get(event.prompt_ref_event_id)
        if base is None or len(base) < event.prompt_ref_tokens:
            raise SchemaError(
                f"event {event.event_id} extends {event.prompt_ref_event_id}, which was not "
                "reconstructed first; feed a rollout's events in call order"
            )
        return base[: event.prompt_ref_tokens]

    def prompt(self, event: CompletionEvent) -> list[int]:
        """The full prompt of ``event`` (and remember it for later events)."""
        prompt = list(event.prompt_token_ids)
        if event.prompt_ref_event_id is not None:
            prompt = self._ref_tokens(event) + prompt
        if len(prompt) != event.prompt_length:
            raise SchemaError(
                f"event {event.event_id}: reconstructed prompt has {len(prompt)} tokens, "
                f"the event says {event.prompt_length}"
            )
        self._tokens[event.event_id] = prompt + list(event.completion_token_ids)
        return prompt

    def request_body(self, event: CompletionEvent) -> dict[str, Any] | None:
        """The full request body of ``event`` (None if redacted or not recorded)."""
        if event.request_body is None:
            return None
        body: dict[str, Any] = json.loads(event.request_body)
        key = HISTORY_KEYS[event.dialect]
        if event.request_history_ref is not None:
            base = self._history.get(event.request_history_ref)
            if base is None or len(base) < event.request_history_prefix:
                raise SchemaError(
                    f"event {event.event_id} extends the history of {event.request_history_ref},"
                    " which was not reconstructed first; feed events in call order"
                )
            body[key] = base[: event.request_history_prefix] + list(body.get(key) or [])
        if isinstance(body.get(key), list):
            self._history[event.event_id] = body[key]
        return body

    def add(self, event: CompletionEvent) -> tuple[list[int], dict[str, Any] | None]:
        """Full prompt and request body of ``event``."""
        return self.prompt(event), self.request_body(event)
