"""Images in a call, in each dialect's own shape, sent with the official SDKs: the proxy has no
image path to the engine, so each is refused with a 400 in the caller's dialect that says where
the image is and what to send instead, nothing of it is recorded, and the same conversation as
text is answered and recorded. The shapes are the browser agent's (infra/harnesses/
browser_main.py): a screenshot in a Chat user message, in an Anthropic tool result; and
Responses' ``input_image``."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from proxy.errors import ProxyError
from proxy.images import find_image, refuse_images

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
DATA_URL = f"data:image/png;base64,{PNG}"


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 2), "upstream") as url:
        config = proxy_config(url, Path(tmp_path_factory.mktemp("images")), auto_register=True)
        with running_proxy(config) as p:
            yield p


def _rollout(proxy: RunningProxy) -> tuple[str, str]:
    rid = f"img-{uuid.uuid4().hex[:8]}"
    return rid, f"{proxy.url}/rollout/{rid}"


def test_chat_an_image_url_is_refused_in_the_dialect_and_text_is_answered(
    proxy: RunningProxy,
) -> None:
    rid, base = _rollout(proxy)
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    parts: Any = [
        {"type": "text", "text": "The page now:"},
        {"type": "image_url", "image_url": {"url": DATA_URL}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": parts}]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "images_not_supported"
    assert error["param"] == "messages" and "messages[0].content[1] is an image" in error["message"]
    assert "--observation text" in error["message"]
    answer = client.chat.completions.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "The page now: text"}]
    )
    assert answer.choices[0].message is not None
    proxy.flush()
    assert [e.call_index for e in completions_of(read_events(proxy.config.log_url), rid)] == [0]


def test_messages_an_image_in_a_tool_result_is_refused_in_the_dialect(
    proxy: RunningProxy,
) -> None:
    rid, base = _rollout(proxy)
    client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    result: Any = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [
            {"type": "text", "text": "ok"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ],
    }
    history: Any = [
        {"role": "user", "content": "Subscribe."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "click", "input": {"element": 2}}],
        },
        {"role": "user", "content": [result]},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=4, messages=history)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert "messages[2].content[0].content[1] is an image" in body["error"]["message"]
    proxy.flush()
    assert completions_of(read_events(proxy.config.log_url), rid) == []


def test_responses_an_input_image_is_refused_in_the_dialect(proxy: RunningProxy) -> None:
    _, base = _rollout(proxy)
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    content: Any = [
        {"type": "input_text", "text": "What is on the page?"},
        {"type": "input_image", "image_url": DATA_URL},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="m", max_output_tokens=4, input=[{"role": "user", "content": content}]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "input"
    assert "input[0].content[1] is an image" in error["message"]


parts = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "tool_result", "x"])}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.sampled_from(["tool_result", "text"]), "content": st.lists(inner, max_size=3)}
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(parts, max_size=4), st.sampled_from(["image_url", "input_image", "image"]))
def test_an_image_anywhere_in_the_parts_is_found_and_nothing_else_is(
    content: list[Any], kind: str
) -> None:
    assert find_image(content, "c") is None
    refuse_images(content, "c", "messages")  # no image: nothing raised
    nested = [*content, {"type": "tool_result", "content": [{"type": kind}]}]
    assert find_image(nested, "c") == f"c[{len(content)}].content[0]"
    with pytest.raises(ProxyError, match=r"is an image"):
        refuse_images(nested, "c", "messages")
