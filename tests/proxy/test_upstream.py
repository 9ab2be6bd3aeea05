"""The upstreams: vLLM's token-in/token-out /inference/v1/generate endpoint, and an unreachable
upstream."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from infra.local.process import free_port
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from proxy.errors import ProxyError
from proxy.upstream import _read_chunks
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, ContinuityClass
from tests.proxy.engine import assert_engine_agrees

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_generate_upstream_records_engine_tokens(vllm_server: VLLMServer, tmp_path: Path) -> None:
    config = proxy_config(
        vllm_server.base_url, tmp_path, auto_register=True, upstream_kind="generate"
    )
    with running_proxy(config) as p:
        client = openai.OpenAI(base_url=f"{p.url}/rollout/gen/v1", api_key="unused")
        history = [{"role": "user", "content": "list the files"}]
        first = client.chat.completions.create(
            model="m",
            messages=history,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=1.0,
            seed=3,
        )
        history += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "and print hello"},
        ]
        client.chat.completions.create(
            model="m",
            messages=history,
            max_tokens=12,  # type: ignore[arg-type]
            temperature=1.0,
            seed=4,
            stream=True,
        )
        p.flush()
    events = completions_of(read_events(config.log_url, group="gen", want=2), "gen")
    assert [e.status for e in events] == [CompletionStatus.OK, CompletionStatus.OK]
    assert [e.continuity for e in events] == [ContinuityClass.FIRST, ContinuityClass.EXACT]
    rebuild = Reconstructor()
    for event in events:
        prompt = rebuild.prompt(event)
        assert_engine_agrees(vllm_server.base_url, vllm_server.served_model_name, prompt, event)


@pytest.mark.parametrize("dialect_path", ["chat/completions", "messages"])
def test_unreachable_upstream_is_a_502_in_the_dialect(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path, dialect_path: str
) -> None:
    port = free_port()
    config = proxy_config(
        f"http://127.0.0.1:{port}",
        tmp_path,
        auto_register=True,
        upstream_model="tiny",
        tokenizer=tiny_model_dir,
        max_model_len=4096,
    )
    with running_proxy(config) as p:
        body = {**CHAT, "stream": True}
        resp = httpx.post(f"{p.url}/rollout/u/v1/{dialect_path}", json=body, timeout=60)
        assert resp.status_code == 502
        if dialect_path == "messages":
            assert resp.json()["error"]["type"] == "api_error"
        else:
            assert resp.json()["error"]["code"] == "upstream_unreachable"
        p.flush()
        (event,) = completions_of(read_events(p.config.log_url, group="u", want=1), "u")
        assert event.status is CompletionStatus.UPSTREAM_ERROR and event.error


def _event(ids: list[int], text: str, finish: str | None = None) -> bytes:
    choice = {"text": text, "token_ids": ids, "finish_reason": finish}
    choice["logprobs"] = {"token_logprobs": [-0.5] * len(ids)}
    return b"data: " + json.dumps({"choices": [choice]}).encode()


def test_the_events_of_one_read_become_one_chunk_and_an_error_follows_them() -> None:
    """The events one network read brought are merged in order (one write downstream); an error
    event among them is raised after the chunk of the events before it, so nothing the harness
    could have been sent is missing from the record."""
    lines = [_event([1, 2], "ab"), b"", _event([3], "c", "stop"), b"", b"data: [DONE]"]
    (chunk,) = _read_chunks(lines)
    assert (chunk.token_ids, chunk.text, chunk.finish_reason) == ([1, 2, 3], "abc", "stop")
    assert chunk.logprobs == [-0.5] * 3
    error = b'data: {"error": {"message": "engine died"}}'
    got = _read_chunks([_event([4], "d"), error, _event([5], "e")])
    assert next(got).token_ids == [4]
    with pytest.raises(ProxyError, match="engine died"):
        next(got)
    assert list(_read_chunks([b": keep-alive", b""])) == []
