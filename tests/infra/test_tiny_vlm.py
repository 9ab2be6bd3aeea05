"""The tiny vision-language model (infra/tiny_vlm.py), built here and served by the real vLLM on
CPU with an image: the engine expands the image into its placeholder tokens, generates, and
reports the token ids and logprobs of what it generated, as for the text model. A screenshot of
headless Chromium is the image."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from infra.harnesses.browser_cdp import Browser
from infra.local.vllm import VLLMServer
from infra.paths import chromium_binary
from infra.tiny_vlm import TinyVLMSpec, build_tiny_vlm


def _chat(server: VLLMServer, content: Any) -> dict[str, Any]:
    body = {
        "model": server.served_model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 1.0,
        "logprobs": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"{server.base_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_vllm_serves_the_tiny_vlm_an_image_on_cpu(
    vlm_server: VLLMServer, tiny_vlm_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = tiny_vlm_dir
    assert build_tiny_vlm(model, text_dir=tiny_model_dir) == model  # reused, not rebuilt
    assert (model / "processor_config.json").is_file()
    with Browser.launch(str(tmp_path), chromium=str(chromium_binary())) as browser:
        browser.page.evaluate("document.body.innerHTML = '<h1>Newsletter</h1><button>Go</button>'")
        png = browser.page.screenshot()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    image = {"type": "image_url", "image_url": {"url": url}}
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    seen = _chat(vlm_server, [{"type": "text", "text": "What is on the page?"}, image])
    text = _chat(vlm_server, "What is on the page?")
    prompt = seen["prompt_token_ids"]
    assert prompt.count(image_id) == TinyVLMSpec().image_seq_len  # the image, as the engine saw it
    assert image_id not in text["prompt_token_ids"]
    for answer in (seen, text):
        choice = answer["choices"][0]
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) >= 1
        assert all(p["logprob"] <= 0 for p in choice["logprobs"]["content"])
