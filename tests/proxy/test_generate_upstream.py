"""The second upstream: vLLM's token-in/token-out /inference/v1/generate endpoint."""

from __future__ import annotations

from pathlib import Path

import openai

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, ContinuityClass
from tests.proxy.engine import assert_engine_agrees


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
