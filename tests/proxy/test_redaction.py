"""Redaction: the redactor's properties, its configuration, and planted secrets through the
real proxy (fast vLLM-format upstream, the tiny model's tokenizer) absent from every recorded
field of the archived events, while the token ids, which are the training data, keep them."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from proxy.config import ProxyConfig
from proxy.redaction import DEFAULT_PATTERNS, RedactionMode, Redactor, build_patterns
from schemas.archive import ArchiveWriter
from schemas.completion import CompletionEvent
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus
from schemas.errors import ConfigError

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7Mh\n"
    "q8YzQ1pNk2Yb3Kd+OzV9fLwXoT4Tg0a\n-----END RSA PRIVATE KEY-----"
)

# --- the redactor --------------------------------------------------------------------------

tokens = st.text(alphabet=ALNUM, min_size=20, max_size=40)
secrets = st.one_of(
    tokens.map(lambda t: "sk-proj-" + t),
    tokens.map(lambda t: "sk-ant-api03-" + t),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16).map(
        lambda t: "AKIA" + t
    ),
    tokens.map(lambda t: "ghp_" + t),
    tokens.map(lambda t: "ofk_" + t),
    st.builds(
        lambda user, host: f"{user}@{host}.example.com",
        st.text(alphabet="abcdefghij.+_", min_size=1, max_size=12).filter(lambda u: u[0] != "."),
        st.text(alphabet="abcdefgh", min_size=1, max_size=8),
    ),
    st.just(PEM),
)
# Filler is any text, kept apart from the secret by a space (a secret glued to letters would
# be a longer token, which the patterns take whole).
filler = st.text(max_size=80)


def redactor() -> Redactor:
    return Redactor(build_patterns(), ["literal-admin-token-123"])


@settings(max_examples=100, deadline=None)
@given(before=filler, secret=secrets, after=filler)
def test_a_planted_secret_never_survives(before: str, secret: str, after: str) -> None:
    r = redactor()
    out = r.text(f"{before} {secret} {after}")
    assert secret not in out
    assert "[REDACTED:" in out
    assert sum(r.counts.values()) >= 1


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200), secret=st.one_of(st.none(), secrets))
def test_redaction_is_idempotent_and_counts_what_it_replaced(text: str, secret: str | None) -> None:
    r = redactor()
    value = text if secret is None else f"{text} {secret}"
    once = r.text(value)
    replaced = sum(r.counts.values())
    assert once.count("[REDACTED:") >= replaced - value.count("[REDACTED:") >= 0
    r.counts.clear()
    assert r.text(once) == once and not r.counts  # nothing left to find


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.\n", max_size=200))
def test_text_without_secrets_is_unchanged(text: str) -> None:
    r = redactor()
    assert r.text(text) == text and not r.counts


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet="abcdef", max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _shape(value: object) -> object:
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return "str" if isinstance(value, str) else value


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [*value, *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


@settings(max_examples=150, deadline=None)
@given(value=json_values, secret=secrets, slot=st.integers(0, 3))
def test_json_keeps_its_shape_and_loses_the_secret(value: object, secret: str, slot: int) -> None:
    body = {"messages": [value, {"content": f"use {secret} now"}][: slot % 2 + 1], "x": value}
    body["messages"].append({"content": secret})  # type: ignore[attr-defined]
    out = redactor().json(body)
    assert _shape(out) == _shape(body)  # same keys, lengths, numbers, booleans and nulls
    assert not [s for s in _strings(out) if secret in s]
    assert json.loads(json.dumps(out)) == out  # still JSON


def test_long_runs_without_a_match_take_linear_time() -> None:
    """A 200 kB run of key-like characters (a base64 blob) beside an e-mail address: a plain
    ``[..]+@`` expression is quadratic there (about 80 s); ours takes milliseconds."""
    start = time.perf_counter()
    out = redactor().text("A" * 200_000 + " x@y.com sk-" + "b" * 100_000)
    assert time.perf_counter() - start < 2.0
    assert out.endswith(" [REDACTED:email] [REDACTED:api_key]")


def test_patterns_are_checked_when_the_config_is_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        ProxyConfig("http://x", redact_patterns=["(unclosed"])
    with pytest.raises(ConfigError, match="matches the empty string"):
        ProxyConfig("http://x", redact_patterns=["a*"])
    with pytest.raises(ConfigError, match=r"unknown redaction mode 'hide'.*mask, off"):
        ProxyConfig("http://x", redaction="hide")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot read the redaction pattern file"):
        ProxyConfig("http://x", redact_file=tmp_path / "missing.txt")
    (tmp_path / "patterns.txt").write_text("# internal hosts\n\nbuild-[0-9]+\\.corp\n")
    config = ProxyConfig("http://x", redact_file=tmp_path / "patterns.txt", redact_patterns=["X9"])
    assert [p.name for p in config.patterns] == [*DEFAULT_PATTERNS, "custom_1", "custom_2"]
    assert Redactor(config.patterns).text("see build-42.corp") == "see [REDACTED:custom_2]"
    assert ProxyConfig("http://x", redaction="off").patterns == []
    assert ProxyConfig("http://x", redaction="off").redaction is RedactionMode.OFF


# --- through the real proxy ----------------------------------------------------------------

ADMIN_TOKEN = "adm-" + "Q" * 24


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 4), "upstream") as url:
        tmp = Path(tmp_path_factory.mktemp("redaction"))
        config = proxy_config(url, tmp, admin_token=ADMIN_TOKEN, redact_patterns=["corp-[0-9]{4}"])
        with running_proxy(config) as p:
            yield p


def test_planted_secrets_are_in_no_recorded_field(
    proxy: RunningProxy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    rollout_id = f"red-{uuid.uuid4().hex[:6]}"
    key = proxy.register(rollout_id, task_id="t", metadata={"owner": "ops@example.org"})["api_key"]
    planted = {
        "api_key": "sk-proj-" + "Ab1" * 10,
        "bearer": "eyJhbGciOiJIUzI1NiJ9.payload.signature42",
        "pem": PEM,
        "email": "jane.doe@example.com",
        "rollout_key": key,
        "admin_token": ADMIN_TOKEN,
        "custom": "corp-1234",
    }
    auth = {"authorization": f"Bearer {key}"}
    history = [
        {"role": "system", "content": f"Deploy with OPENAI_API_KEY={planted['api_key']}."},
        {"role": "user", "content": f"curl -H 'Authorization: Bearer {planted['bearer']}' x"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": f"my key:\n{planted['pem']}\nmail {planted['email']}"},
    ]
    url = f"{proxy.url}/v1/chat/completions"
    first = httpx.post(
        url,
        json={"model": "m", "messages": history, "max_tokens": 4, "stop": [planted["custom"]]},
        headers=auth,
        timeout=60,
    )
    assert first.status_code == 200, first.text
    answer = first.json()["choices"][0]["message"]
    history += [
        {"role": "assistant", "content": answer["content"]},
        {"role": "user", "content": f"env: KEY={key} ADMIN={ADMIN_TOKEN}"},
    ]
    second = httpx.post(
        url, json={"model": "m", "messages": history, "max_tokens": 4}, headers=auth, timeout=60
    )
    assert second.status_code == 200, second.text
    admin = proxy.admin_headers
    reward = httpx.post(
        f"{proxy.url}/rollout/{rollout_id}/reward",
        json={"reward": 1.0, "verifier_output": f"saw {planted['api_key']}"},
        headers=admin,
    )
    assert reward.status_code == 201
    finish = httpx.post(
        f"{proxy.url}/admin/rollouts/{rollout_id}/finish",
        json={"exit_code": 0, "message": f"mailed {planted['email']}"},
        headers=admin,
    )
    assert finish.status_code == 200

    proxy.flush()
    records = [
        r
        for r in read_events(proxy.config.log_url, group=rollout_id, want=5)
        if r.rollout_id == rollout_id  # type: ignore[union-attr]
    ]
    calls = sorted(
        (r for r in records if isinstance(r, CompletionEvent)), key=lambda e: e.call_index
    )
    assert [c.status for c in calls] == [CompletionStatus.OK] * 2
    assert all(c.redacted and len(c.completion_token_ids) == 4 for c in calls)
    ArchiveWriter(tmp_path / "archive").write(records)

    # Every field of every record, as DuckDB reads it from the archive, as text.
    db = duckdb.connect()
    text = ""
    for kind in ("completion", "rollout", "reward"):
        glob = str(tmp_path / "archive" / f"record={kind}" / "*" / "*.parquet")
        rows = db.sql(f"SELECT CAST(to_json(t) AS VARCHAR) FROM read_parquet('{glob}') t")
        text += "\n".join(row[0] for row in rows.fetchall())
    assert text.count('"event_id"') == len(records)
    for name, secret in planted.items():
        for line in secret.splitlines():  # JSON escapes a PEM's newlines: each line on its own
            assert line not in text, f"{name} recorded: {line}"
    assert "[REDACTED:api_key]" in text and "[REDACTED:private_key]" in text
    assert "[REDACTED:email]" in text and "[REDACTED:secret]" in text
    assert "Bearer [REDACTED:bearer_token]" in text and "[REDACTED:custom_1]" in text

    # The bodies are still whole, valid JSON in delta form, the history rebuilds.
    rebuilt = Reconstructor()
    prompts = [rebuilt.add(c) for c in calls]
    body = prompts[1][1]
    assert body is not None and len(body["messages"]) == len(history)
    assert body["messages"][0]["content"] == "Deploy with OPENAI_API_KEY=[REDACTED:api_key]."

    # Token ids are never redacted: the prompt's ids still decode to the secrets.
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    decoded = tokenizer.decode(prompts[1][0])
    assert planted["api_key"] in decoded and planted["email"] in decoded and key in decoded

    metrics = httpx.get(f"{proxy.url}/metrics").text
    counted = re.findall(r'openforge_proxy_redactions_total\{pattern="(\w+)"\} (\S+)', metrics)
    assert {"api_key", "email", "private_key", "secret", "bearer_token"} <= dict(counted).keys()


def test_a_rollout_registered_with_record_false_publishes_nothing(proxy: RunningProxy) -> None:
    rollout_id = f"off-{uuid.uuid4().hex[:6]}"
    key = proxy.register(rollout_id, task_id="t", record=False)["api_key"]
    auth = {"authorization": f"Bearer {key}"}
    call = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    resp = httpx.post(f"{proxy.url}/v1/chat/completions", json=call, headers=auth, timeout=60)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] is not None
    admin = proxy.admin_headers
    assert httpx.post(
        f"{proxy.url}/rollout/{rollout_id}/reward", json={"reward": 1}, headers=admin
    ).is_success
    assert httpx.post(f"{proxy.url}/admin/rollouts/{rollout_id}/finish", headers=admin).is_success
    # A recorded rollout after it, so the log is known to have caught up.
    marker = f"on-{uuid.uuid4().hex[:6]}"
    proxy.register(marker)
    proxy.flush()
    records = read_events(proxy.config.log_url, group=rollout_id, want=1)
    assert any(r.rollout_id == marker for r in records)  # type: ignore[union-attr]
    assert not [r for r in records if r.rollout_id == rollout_id]  # type: ignore[union-attr]
    bad = httpx.post(f"{proxy.url}/admin/rollouts", json={"record": "no"}, headers=admin)
    assert bad.status_code == 400 and "'record'" in bad.json()["error"]["message"]


@settings(max_examples=100, deadline=None)
@given(
    tools=st.lists(st.sampled_from(["ls", "token=sk-abcdefghijklmnopqrstuvwx", "key-1", 1, True])),
    system=st.sampled_from(["plain", "mail me: a.person@example.com", "key-1 here"]),
    calls=st.integers(1, 4),
)
def test_a_body_redacts_as_its_json_does_when_fields_repeat(
    tools: list[object], system: str, calls: int
) -> None:
    """The remembered top-level fields give the same values and counts as a full walk, also
    when the caller's own secret (``key-1``) or an equal-but-different value (1 / True) comes
    in a repeated field."""
    fast, slow = Redactor(build_patterns()), Redactor(build_patterns())
    for i in range(calls):
        body = {"tools": [{"description": t} for t in tools], "system": system, "n": i}
        body["messages"] = [{"role": "user", "content": f"turn {i} key-1"}]
        assert fast.body(body, ("key-1",)) == slow.json(body, ("key-1",))
        got = json.dumps(fast.body(dict(body, tools=[{"description": 1}]), ("key-1",)))
        assert got == json.dumps(slow.json(dict(body, tools=[{"description": 1}]), ("key-1",)))
        assert fast.counts == slow.counts
