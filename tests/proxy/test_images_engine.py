"""Images through the proxy to the real engine: vLLM on CPU serving the tiny VLM
(infra/tiny_vlm.py), called with the official SDKs in the three dialects.

A screenshot in a call reaches the engine (its prompt holds the image's placeholder tokens), the
answer comes back in the caller's dialect, and the call is recorded with the prompt ids the
engine used, the generated ids and logprobs, and the image's hash; the image's bytes are stored
once by content hash (a screenshot resent with the history is not stored again) and the
recorded body refers to them. Replaying the recorded call on the engine, images restored from
the store, gives the same prompt and the same tokens."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import uuid
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from PIL import Image, ImageDraw
from transformers import AutoTokenizer

from infra.image_store import REF_PREFIX, ImageStore, ref
from infra.local.vllm import VLLMServer
from infra.tiny_vlm import TinyVLMSpec
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus, ContinuityClass

PER_IMAGE = TinyVLMSpec().image_seq_len


def png(label: str) -> bytes:
    """A small page-like screenshot with ``label`` drawn on it."""
    image = Image.new("RGB", (96, 64), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((8, 36, 60, 54), outline="black", fill="#dde")
    draw.text((8, 8), label, fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _image_token(model_dir: Path) -> int:
    token = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("<image>")
    assert isinstance(token, int)
    return token


def _replay(server: VLLMServer, body: dict[str, Any]) -> dict[str, Any]:
    """The recorded Chat Completions call again, straight to the engine (not streamed)."""
    replay = {
        **body,
        "model": server.served_model_name,
        "stream": False,
        "logprobs": True,
        "return_token_ids": True,
    }
    replay.pop("stream_options", None)
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", json=replay, timeout=300)
    resp.raise_for_status()
    return dict(resp.json())


def test_chat_screenshots_reach_the_engine_and_are_recorded_once(
    vlm_server: VLLMServer, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    config = proxy_config(vlm_server.base_url, tmp_path, auto_register=True)
    rid = f"img-{uuid.uuid4().hex[:8]}"
    first_shot, second_shot = png("Newsletter"), png("Thanks")
    with running_proxy(config) as p:
        client = openai.OpenAI(base_url=f"{p.url}/rollout/{rid}/v1", api_key="k")
        history: list[Any] = [
            {"role": "system", "content": "You operate a web browser."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "The page:"},
                    {"type": "image_url", "image_url": {"url": data_url(first_shot)}},
                ],
            },
        ]
        first = client.chat.completions.create(
            model="m", messages=history, max_tokens=6, temperature=1.0, seed=1
        )
        history += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "After your click:"},
                    {"type": "image_url", "image_url": {"url": data_url(second_shot)}},
                ],
            },
        ]
        stream = client.chat.completions.create(
            model="m", messages=history, max_tokens=6, temperature=1.0, seed=2, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        p.flush()
        metrics = httpx.get(f"{p.url}/metrics").text
    events = completions_of(read_events(config.log_url, want=2), rid)
    assert [e.status for e in events] == [CompletionStatus.OK, CompletionStatus.OK]
    rebuild = Reconstructor()
    prompts = [rebuild.prompt(e) for e in events]
    bodies = [rebuild.request_body(e) for e in events]

    # The engine saw each image as its placeholder tokens; the event names the images.
    image_token = _image_token(tiny_vlm_dir)
    assert [x.count(image_token) for x in prompts] == [PER_IMAGE, 2 * PER_IMAGE]
    assert [e.prompt_length for e in events] == [len(x) for x in prompts]
    assert events[0].image_ids == [sha(first_shot)]
    assert events[1].image_ids == [sha(first_shot), sha(second_shot)]
    # The second call extends the first: exact only if the engine's ids prove it.
    extends = prompts[1][: len(prompts[0]) + len(events[0].completion_token_ids)] == [
        *prompts[0],
        *events[0].completion_token_ids,
    ]
    expected = ContinuityClass.EXACT if extends else ContinuityClass.REWRITTEN
    assert events[1].continuity is expected

    # Stored once each (the first screenshot was sent twice), referenced from the bodies.
    store = ImageStore(config.images_root())
    assert store.usage() == (2, len(first_shot) + len(second_shot))
    assert 'openforge_proxy_images_total{kind="in_prompt"} 3.0' in metrics
    assert 'openforge_proxy_images_total{kind="stored"} 2.0' in metrics
    assert f"openforge_proxy_image_store_bytes_total {len(first_shot) + len(second_shot)}.0" in (
        metrics
    )
    assert store.get(sha(second_shot)) == (second_shot, "image/png")
    recorded = "".join(e.request_body or "" for e in events)
    assert "base64," not in recorded and ref(sha(second_shot)) in recorded
    assert bodies[1] is not None
    assert bodies[1]["messages"][1]["content"][1]["image_url"]["url"] == ref(sha(first_shot))

    # Replayed from the records, images restored from the store: the same prompt and tokens.
    for event, prompt, body in zip(events, prompts, bodies, strict=True):
        answer = _replay(vlm_server, store.resolve(body))
        assert answer["prompt_token_ids"] == prompt
        choice = answer["choices"][0]
        assert choice["token_ids"] == event.completion_token_ids
        logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
        assert all(
            math.isclose(a, b, abs_tol=1e-4)
            for a, b in zip(logprobs, event.completion_logprobs, strict=True)
        )
    assert json.loads(events[1].response_body or "{}")["choices"][0]["message"]["content"] == (
        streamed or None
    )


def test_messages_a_screenshot_in_a_tool_result_reaches_the_engine(
    vlm_server: VLLMServer, tiny_vlm_dir: Path, tmp_path: Path
) -> None:
    """Anthropic's shape (the browser agent's): the screenshot inside the tool result."""
    config = proxy_config(vlm_server.base_url, tmp_path, auto_register=True)
    rid = f"img-{uuid.uuid4().hex[:8]}"
    shot = png("Settings")
    payload = base64.b64encode(shot).decode()
    source = {"type": "base64", "media_type": "image/png", "data": payload}
    history: Any = [
        {"role": "user", "content": "Save the settings."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "click", "input": {"element": 2}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "clicked"},
                        {"type": "image", "source": source},
                    ],
                }
            ],
        },
    ]
    tools: Any = [{"name": "click", "input_schema": {"type": "object"}}]
    with running_proxy(config) as p:
        client = anthropic.Anthropic(base_url=f"{p.url}/rollout/{rid}", api_key="k")
        answer = client.messages.create(model="m", max_tokens=6, messages=history, tools=tools)
        p.flush()
    assert answer.type == "message" and answer.role == "assistant"
    (event,) = completions_of(read_events(config.log_url), rid)
    prompt = Reconstructor().prompt(event)
    assert prompt.count(_image_token(tiny_vlm_dir)) == PER_IMAGE
    assert event.image_ids == [sha(shot)] and event.status is CompletionStatus.OK
    body = json.loads(event.request_body or "{}")
    block = body["messages"][2]["content"][0]["content"][1]
    assert block["source"] == {**source, "data": ref(sha(shot))}
    assert len(event.completion_token_ids) == len(event.completion_logprobs) >= 1


def test_responses_an_input_image_without_bodies_keeps_only_its_hash(
    vlm_server: VLLMServer, tmp_path: Path
) -> None:
    """``--no-bodies``: the image is not stored (nor the body); its hash and tokens are."""
    config = proxy_config(vlm_server.base_url, tmp_path, auto_register=True, record_bodies=False)
    rid = f"img-{uuid.uuid4().hex[:8]}"
    shot = png("Cart")
    content: Any = [
        {"type": "input_text", "text": "What is on the page?"},
        {"type": "input_image", "image_url": data_url(shot), "detail": "auto"},
    ]
    with running_proxy(config) as p:
        client = openai.OpenAI(base_url=f"{p.url}/rollout/{rid}/v1", api_key="k")
        answer = client.responses.create(
            model="m", max_output_tokens=6, input=[{"role": "user", "content": content}]
        )
        p.flush()
    (event,) = completions_of(read_events(config.log_url), rid)
    assert answer.status in {"completed", "incomplete"}  # 6 tokens: perhaps cut short
    assert answer.usage is not None and answer.usage.input_tokens == event.prompt_length
    assert event.image_ids == [sha(shot)] and event.redacted
    assert event.request_body is None and event.response_body is None
    assert event.prompt_length > PER_IMAGE and event.completion_token_ids
    assert ImageStore(config.images_root()).usage() == (0, 0)
    assert REF_PREFIX.startswith("openforge-image:")
