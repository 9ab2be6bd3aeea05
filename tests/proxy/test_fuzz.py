"""Fuzzing the three dialects against a running proxy (the fast vLLM-format upstream behind it).

Whatever a client sends (wrong types, huge or non-finite numbers, lone surrogates, 100,000-deep
nesting, bytes that are not JSON, unknown routes and methods), the proxy answers below 500 and
every error is a JSON body in the caller's dialect; every call answered 200 is recorded; the
proxy is healthy afterwards. At least 2,000 requests per dialect.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus, Dialect

REQUESTS = 2_000  # per dialect
PER_EXAMPLE = 10  # requests per hypothesis example, sent at once (the proxy serves them together)

BASES: dict[Dialect, tuple[str, dict[str, Any]]] = {
    Dialect.CHAT: (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
    Dialect.RESPONSES: ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 4}),
    Dialect.MESSAGES: (
        "/v1/messages",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
}
FIELDS = {
    Dialect.CHAT: ["messages", "tools", "n", "stream_options", "max_completion_tokens", "stop"],
    Dialect.RESPONSES: ["input", "instructions", "tools", "metadata", "previous_response_id"],
    Dialect.MESSAGES: ["messages", "system", "tools", "stop_sequences"],
}
COMMON = ["model", "max_tokens", "stream", "temperature", "top_p", "top_k", "seed", "stop"]
ROLES = ["user", "assistant", "system", "developer", "tool", "bogus"]
BLOCK_TYPES = ["text", "tool_use", "tool_result", "image", "message", "function_call",
               "function_call_output", "custom_tool_call", "input_text"]  # fmt: skip

text = st.text(max_size=6) | st.sampled_from(["\ud800", "a\udfff", "\x00", "é", ""])
numbers = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([2**63, 2**63 - 1, -(2**63) - 1, 10**400, 0, -1, 1])
    | st.floats(allow_nan=True, allow_infinity=True)
)
leaves = st.none() | st.booleans() | numbers | text
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
# Message- and item-like objects, so the fuzzing reaches past the first type check.
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(BLOCK_TYPES) | values},
    optional={
        "text": values,
        "content": values,
        "input": values,
        "name": values,
        "arguments": values,
        "output": values,
        "id": values,
        "call_id": values,
    },
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | values},
    optional={
        "content": text | values | st.lists(parts, max_size=3),
        "tool_calls": values | st.lists(st.fixed_dictionaries({"function": values}), max_size=2),
        "type": st.sampled_from(BLOCK_TYPES),
        "tool_call_id": values,
    },
)
tools = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", "web_search"]) | values},
    optional={"name": values, "function": values, "input_schema": values, "parameters": values},
)
field_values = (
    values
    | st.lists(messages, max_size=3)
    | st.lists(tools, max_size=2)
    | messages
    | st.lists(parts, max_size=3)
)
RAW = [
    b"",
    b"{",
    b"[]",
    b'"text"',
    b"\xff\xfe",
    b'{"model": NaN}',
    b'{"temperature": Infinity, "model": "m"}',
    b'{"seed": 1e999}',
    b'{"n": ' + b"9" * 5000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}',
]


@st.composite
def bodies(draw: st.DrawFn, dialect: Dialect) -> bytes:
    """A request body: the dialect's valid base with up to three fields replaced, or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(RAW))
    body = dict(BASES[dialect][1])
    names = st.sampled_from(COMMON + FIELDS[dialect]) | text
    for name, value in draw(st.dictionaries(names, field_values, max_size=3)).items():
        body[name] = value
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    return json.dumps(body, allow_nan=True).encode()  # ensure_ascii keeps lone surrogates


def assert_in_dialect(dialect: Dialect, resp: httpx.Response) -> None:
    """Below 500; an error is a JSON body in the dialect's error shape."""
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code < 400:
        return
    body = resp.json()
    error = body["error"]
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    if dialect is Dialect.MESSAGES:
        assert body["type"] == "error"
    else:
        assert set(error) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 2), "upstream") as url:
        config = proxy_config(url, Path(tmp_path_factory.mktemp("fuzz")), auto_register=True)
        with running_proxy(config) as p:
            yield p


@pytest.mark.parametrize("dialect", list(BASES), ids=lambda d: d.value)
def test_fuzzed_calls_are_answered_in_dialect_and_recorded(
    proxy: RunningProxy, dialect: Dialect
) -> None:
    path = BASES[dialect][0]
    prefix = f"fz-{dialect.value}-{uuid.uuid4().hex[:6]}"
    statuses: Counter[int] = Counter()
    headers = {"content-type": "application/json"}
    if dialect is Dialect.MESSAGES:
        headers["anthropic-version"] = "2023-06-01"
    sent = iter(range(10**9))
    with (
        httpx.Client(base_url=proxy.url, timeout=30) as client,
        ThreadPoolExecutor(PER_EXAMPLE) as pool,
    ):

        def call(body: bytes) -> httpx.Response:
            rollout = f"{prefix}-{next(sent)}"  # one rollout per call: no continuity between them
            return client.post(f"/rollout/{rollout}{path}", content=body, headers=headers)

        @settings(
            max_examples=REQUESTS // PER_EXAMPLE,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(batch=st.lists(bodies(dialect), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
        def calls(batch: list[bytes]) -> None:
            for resp in pool.map(call, batch):
                statuses[resp.status_code] += 1
                assert_in_dialect(dialect, resp)

        calls()
        assert sum(statuses.values()) >= REQUESTS
        assert statuses[200] > REQUESTS // 10, statuses  # the fuzzing reached the engine, too
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"

    proxy.flush()
    everything = proxy.publisher.stats.published  # the log holds only what was published
    events = [
        r
        for r in read_events(proxy.config.log_url, group=prefix, want=everything)
        if isinstance(r, CompletionEvent) and r.rollout_id.startswith(prefix)
    ]
    assert sum(e.status is CompletionStatus.OK for e in events) == statuses[200]
    assert proxy.publisher.stats.dead_lettered == 0


ROUTES = [
    ("GET", "/v1/messages", 405, Dialect.MESSAGES),
    ("POST", "/v1/messages/nothing", 404, Dialect.MESSAGES),
    ("PUT", "/rollout/r/v1/chat/completions", 405, Dialect.CHAT),
    ("POST", "/v1/nothing", 404, Dialect.CHAT),
    ("DELETE", "/v1/responses", 405, Dialect.RESPONSES),
    ("GET", "/admin/nothing", 404, Dialect.CHAT),
]


@pytest.mark.parametrize(("method", "path", "status", "dialect"), ROUTES)
def test_unknown_routes_and_methods_answer_in_the_dialect_of_their_prefix(
    proxy: RunningProxy, method: str, path: str, status: int, dialect: Dialect
) -> None:
    resp = httpx.request(method, proxy.url + path)
    assert resp.status_code == status
    assert_in_dialect(dialect, resp)
    if status == 405:
        assert "POST" in resp.headers["allow"]


@pytest.mark.parametrize("dialect", list(BASES), ids=lambda d: d.value)
@pytest.mark.parametrize(
    "change",
    [{"seed": 2**63}, {"seed": -(2**63) - 1}, {"top_k": 10**30}, {"temperature": 10**400}],
    ids=["seed-above-int64", "seed-below-int64", "top_k-huge", "temperature-beyond-float"],
)
def test_numbers_outside_the_records_types_are_a_400_naming_the_field(
    proxy: RunningProxy, dialect: Dialect, change: dict[str, int]
) -> None:
    path, base = BASES[dialect]
    resp = httpx.post(f"{proxy.url}/rollout/num-{uuid.uuid4().hex[:6]}{path}", json=base | change)
    assert resp.status_code == 400
    assert_in_dialect(dialect, resp)
    assert next(iter(change)) in resp.json()["error"]["message"]
