"""Image parts that cannot be answered, in each dialect's own shape, sent with the official SDKs:
an image by URL (the proxy fetches none), data that is not base64, a media type that is not an
image the engine takes. Each is a 400 in the caller's dialect naming where the image is and what
to send instead, before the call is numbered: nothing is recorded. And the parsing itself, as
properties: any mix of text and image parts keeps its images in order and its text; a recorded
body refers to each image by its hash and gives the original back from the store.

(Images that can be answered go to the engine: tests/proxy/test_images_engine.py.)"""

from __future__ import annotations

import base64
import itertools
import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.image_store import REF_PREFIX, ImageStore, digest
from openforge.testing import fast_upstream
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
    serve_in_thread,
)
from proxy.canonical import text_of
from proxy.errors import ProxyError
from proxy.images import content, image_ids, recorded_body

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()


@pytest.fixture(scope="module")
def proxy(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 2), "upstream") as url:
        config = proxy_config(url, Path(tmp_path_factory.mktemp("images")), auto_register=True)
        with running_proxy(config) as p:
            yield p


def _rollout(proxy: RunningProxy) -> tuple[str, str]:
    rid = f"img-{uuid.uuid4().hex[:8]}"
    return rid, f"{proxy.url}/rollout/{rid}"


def test_chat_an_image_by_url_is_refused_in_the_dialect(proxy: RunningProxy) -> None:
    rid, base = _rollout(proxy)
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    parts: Any = [
        {"type": "text", "text": "The page now:"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/shot.png"}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": parts}]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "image_url_not_supported"
    assert error["param"] == "messages" and "messages[0].content[1]" in error["message"]
    assert "base64 data URL" in error["message"]
    proxy.flush()
    assert completions_of(read_events(proxy.config.log_url), rid) == []


def test_messages_undecodable_image_data_in_a_tool_result_is_refused(
    proxy: RunningProxy,
) -> None:
    rid, base = _rollout(proxy)
    client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": "not base64!"}
    result: Any = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "ok"}, {"type": "image", "source": source}],
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
    message = body["error"]["message"]
    assert "messages[2].content[0].content[1] is not valid base64 image data" in message
    proxy.flush()
    assert completions_of(read_events(proxy.config.log_url), rid) == []


def test_responses_an_image_of_another_media_type_is_refused(proxy: RunningProxy) -> None:
    _, base = _rollout(proxy)
    client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    svg = "data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode()
    parts: Any = [
        {"type": "input_text", "text": "What is on the page?"},
        {"type": "input_image", "image_url": svg},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="m", max_output_tokens=4, input=[{"role": "user", "content": parts}]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "input"
    assert error["code"] == "invalid_image" and "image/svg+xml" in error["message"]
    assert "input[0].content[1]" in error["message"]


# --- properties of the parsing ----------------------------------------------------------------

pixels = st.binary(min_size=1, max_size=64)
text_part = st.builds(
    lambda kind, text: {"type": kind, "text": text},
    st.sampled_from(["text", "input_text"]),
    st.text(max_size=8),
)


def _image(kind: str, data: bytes) -> dict[str, Any]:
    payload = base64.b64encode(data).decode()
    url = f"data:image/png;base64,{payload}"
    if kind == "image_url":
        return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    if kind == "input_image":
        return {"type": "input_image", "image_url": url}
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": payload},
    }


image_part = st.builds(_image, st.sampled_from(["image_url", "input_image", "image"]), pixels)


@settings(max_examples=200)
@given(st.lists(st.one_of(text_part, image_part), max_size=6))
def test_content_keeps_the_images_in_order_and_the_text(parts: list[dict[str, Any]]) -> None:
    out = content(parts, "c", "messages")
    expected = [digest(base64.b64decode(_payload(p))) for p in parts if "text" not in p]
    if not expected:
        assert out == text_of(parts)  # no image: a string, as before
        return
    assert isinstance(out, list)
    assert image_ids([{"role": "user", "content": out}]) == expected
    assert "".join(p.get("text", "") for p in out) == text_of(parts)
    assert all(a["type"] != "text" or b["type"] != "text" for a, b in itertools.pairwise(out))


def _payload(part: dict[str, Any]) -> str:
    if part["type"] == "image":
        return str(part["source"]["data"])
    url = part["image_url"]
    return str((url["url"] if isinstance(url, dict) else url).split(",", 1)[1])


body_strategy = st.recursive(
    st.one_of(image_part, text_part, st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.fixed_dictionaries({"role": st.just("user"), "content": st.lists(inner, max_size=3)}),
    ),
    max_leaves=8,
)


@settings(max_examples=150)
@given(body_strategy)
def test_a_recorded_body_refers_to_its_images_and_resolves_back(body: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ImageStore(Path(tmp))
        recorded = recorded_body(body, store)
        text = json.dumps(recorded)
        assert "base64," not in text and not _has_payload(recorded)
        assert store.resolve(recorded) == body


def _has_payload(body: Any) -> bool:
    """Image data left in a recorded body (Messages' ``data`` that is not a reference)."""
    if isinstance(body, list):
        return any(_has_payload(x) for x in body)
    if isinstance(body, dict):
        data = body.get("data")
        if isinstance(data, str) and not data.startswith(REF_PREFIX):
            return True
        return any(_has_payload(v) for v in body.values())
    return False


def test_an_image_part_error_is_a_proxy_error_with_its_place() -> None:
    with pytest.raises(ProxyError, match=r"c\[0\] is an image by URL"):
        content([{"type": "input_image", "image_url": "https://x/y.png"}], "c", "input")
    with pytest.raises(ProxyError, match=r"c\[1\] is an image without inline data"):
        content([{"type": "text", "text": "a"}, {"type": "input_image", "file_id": "f"}], "c", "i")
