"""Attribution and bad input: errors in the caller's dialect, nothing recorded elsewhere."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def strict(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    tmp = Path(tmp_path_factory.mktemp("strict"))
    config = proxy_config(
        vllm_server.base_url,
        tmp,
        require_keys=True,
        max_body_bytes=64 * 1024,
        admin_token="admin-secret",
    )
    with running_proxy(config) as p:
        yield p


def _register(p: RunningProxy, rollout_id: str) -> str:
    resp = httpx.post(
        f"{p.url}/admin/rollouts",
        json={"rollout_id": rollout_id, "task_id": "t"},
        headers={"authorization": "Bearer admin-secret"},
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["api_key"])


def _openai_error(resp: httpx.Response, status: int) -> dict:  # type: ignore[type-arg]
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and {"message", "type"} <= set(body["error"])
    return dict(body["error"])


def _anthropic_error(resp: httpx.Response, status: int) -> dict:  # type: ignore[type-arg]
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == "error" and {"type", "message"} <= set(body["error"])
    return dict(body["error"])


def test_a_rollout_key_never_records_into_another_rollout(strict: RunningProxy) -> None:
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    key_a, key_b = _register(strict, a), _register(strict, b)
    # A's key on B's path: refused.
    resp = httpx.post(
        f"{strict.url}/rollout/{b}/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {key_a}"},
        timeout=60,
    )
    assert _openai_error(resp, 403)["type"] == "permission_error"
    resp = httpx.post(
        f"{strict.url}/rollout/{b}/v1/messages",
        json=MESSAGES,
        headers={"x-api-key": key_a, "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert _anthropic_error(resp, 403)["type"] == "permission_error"
    # B's path without B's key (keys required): refused.
    resp = httpx.post(f"{strict.url}/rollout/{b}/v1/chat/completions", json=CHAT, timeout=60)
    assert _openai_error(resp, 401)["type"] == "authentication_error"
    # The key alone attributes to its own rollout; on its own path too.
    assert (
        httpx.post(
            f"{strict.url}/v1/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {key_a}"},
            timeout=60,
        ).status_code
        == 200
    )
    assert (
        httpx.post(
            f"{strict.url}/rollout/{b}/v1/chat/completions",
            json=CHAT,
            headers={"authorization": f"Bearer {key_b}"},
            timeout=60,
        ).status_code
        == 200
    )
    strict.flush()
    records = read_events(strict.config.log_url, group=f"g-{a}", want=4)
    assert len(completions_of(records, a)) == 1
    assert len(completions_of(records, b)) == 1


def test_unknown_keys_and_rollouts(strict: RunningProxy) -> None:
    resp = httpx.post(
        f"{strict.url}/v1/chat/completions",
        json=CHAT,
        headers={"authorization": "Bearer ofk_not-a-real-key"},
    )
    assert _openai_error(resp, 401)["code"] == "invalid_api_key"
    resp = httpx.post(
        f"{strict.url}/rollout/nope/v1/messages",
        json=MESSAGES,
        headers={"anthropic-version": "2023-06-01"},
    )
    assert _anthropic_error(resp, 404)["type"] == "not_found_error"
    resp = httpx.post(f"{strict.url}/v1/responses", json={"model": "m", "input": "hi"})
    assert "no rollout" in _openai_error(resp, 401)["message"]
    resp = httpx.post(f"{strict.url}/admin/rollouts", json={})
    assert resp.status_code == 401


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("chat/completions", {"model": "m", "messages": "hi"}, "messages"),
        ("chat/completions", {"model": 3, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ("chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
        ("chat/completions", {**CHAT, "n": 2}, "n"),
        ("responses", {"model": "m", "input": 5}, "input"),
        (
            "responses",
            {"model": "m", "input": "x", "previous_response_id": "resp_1"},
            "previous_response_id",
        ),
        ("messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ("messages", {**MESSAGES, "messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ],
)
def test_wrong_types_get_400_in_the_dialect(
    strict: RunningProxy, path: str, body: dict, param: str
) -> None:  # type: ignore[type-arg]
    rollout = f"v-{uuid.uuid4().hex[:6]}"
    key = _register(strict, rollout)
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/{path}",
        json=body,
        headers={"authorization": f"Bearer {key}", "x-api-key": key},
    )
    if path == "messages":
        assert _anthropic_error(resp, 400)["type"] == "invalid_request_error"
        assert param in resp.json()["error"]["message"]
    else:
        assert _openai_error(resp, 400)["param"] == param


def test_bad_json_and_oversize_bodies(strict: RunningProxy) -> None:
    rollout = f"j-{uuid.uuid4().hex[:6]}"
    key = _register(strict, rollout)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/chat/completions", content=b"{not json", headers=headers
    )
    assert "not valid JSON" in _openai_error(resp, 400)["message"]
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/messages", content=b"[1, 2]", headers=headers
    )
    assert _anthropic_error(resp, 400)["type"] == "invalid_request_error"
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 100_000}]}
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/chat/completions", json=big, headers=headers
    )
    assert _openai_error(resp, 413)["type"] == "invalid_request_error"
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/messages",
        json={**MESSAGES, "system": "x" * 100_000},
        headers=headers,
    )
    assert _anthropic_error(resp, 413)["type"] == "request_too_large"


def test_prompt_longer_than_the_context_is_refused(strict: RunningProxy) -> None:
    rollout = f"c-{uuid.uuid4().hex[:6]}"
    key = _register(strict, rollout)
    words = " ".join(["hello world"] * 6000)  # well past the tiny model's 4096-token context
    resp = httpx.post(
        f"{strict.url}/rollout/{rollout}/v1/chat/completions",
        json={**CHAT, "messages": [{"role": "user", "content": words[:60_000]}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert _openai_error(resp, 400)["code"] == "context_length_exceeded"
