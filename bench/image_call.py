"""An image call's added latency through the proxy, beside a text call of the same prompt
length, and the storage per screenshot step.

    .venv/bin/python -m bench.image_call [--calls 20] [--steps 8]

Code path: vLLM on CPU serving the tiny VLM (``infra/tiny_vlm.py``); the proxy in a thread of
this process (``openforge.testing.proxy.running_proxy``) in front of it. Latency: four kinds of
Chat Completions calls, interleaved, ``--calls`` of each, one token generated each:

- ``image/proxy``: a screenshot (a real Chromium PNG) and a line of text, through the proxy,
  which sends it to the engine's chat endpoint (``proxy/upstream_chat.py``);
- ``image/engine``: the same call straight to vLLM's chat endpoint (the baseline);
- ``text/proxy``: a text call whose prompt has the same token count (the image's placeholder
  tokens replaced by words), through the proxy's token-in path (``/v1/completions``);
- ``text/engine``: that text call straight to vLLM's chat endpoint.

The added latency of each path is its proxy p50 minus its engine p50. Proof of path: every
``image/proxy`` call's event lists the screenshot's hash and its engine prompt holds the image
tokens; every ``text/proxy`` event lists none and was rendered by the proxy.

Storage: a browser-like conversation of ``--steps`` calls through the proxy, each adding a new
screenshot (Chromium, 1280x720, a page that changes per step) to the history; measured: the
image store's bytes per step (each screenshot once) and the event log's bytes per step, beside
what the same screenshots take inline as base64 (each once, as the history's delta encoding
would store them).
"""

from __future__ import annotations

import argparse
import base64
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer

from infra.harnesses.browser_cdp import Browser
from infra.image_store import ImageStore
from infra.local.vllm import VLLMServer
from infra.paths import cache_dir, chromium_binary
from infra.tiny_vlm import build_tiny_vlm
from openforge.stack import tiny_model
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from schemas.delta import Reconstructor

SYSTEM = "You operate a web browser."


def screenshots(n: int, work: Path) -> list[bytes]:
    """``n`` screenshots of a page that changes each time."""
    shots = []
    work.mkdir(parents=True, exist_ok=True)
    with Browser.launch(str(work), chromium=str(chromium_binary())) as browser:
        for i in range(n):
            html = f"<h1>Step {i}</h1><p>{'Order summary. ' * (i + 3)}</p><button>Next</button>"
            browser.page.evaluate(f"document.body.innerHTML = {html!r}")
            shots.append(browser.page.screenshot())
    return shots


def _image_message(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "The page now:"},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


def _post(
    client: httpx.Client, url: str, messages: list[dict[str, Any]], model: str = "m"
) -> float:
    body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0.0}
    start = time.perf_counter()
    resp = client.post(url, json=body, timeout=300)
    resp.raise_for_status()
    return time.perf_counter() - start


def _text_like(tokenizer: Any, image_prompt: int, renders: Any) -> list[dict[str, Any]]:
    """A text user message whose rendered prompt has ``image_prompt`` tokens."""
    words = 1
    while True:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "The page now:" + " page" * words},
        ]
        n = len(renders(messages))
        if n >= image_prompt:
            assert n == image_prompt, (n, image_prompt)
            return messages
        words += 1
        assert words < 10 * image_prompt, "the text prompt does not grow with its words"


def latency(server: VLLMServer, model: Path, png: bytes, calls: int, root: Path) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(model))

    def renders(messages: list[dict[str, Any]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    image = [{"role": "system", "content": SYSTEM}, _image_message(png)]
    config = proxy_config(server.base_url, root, auto_register=True)
    times: dict[str, list[float]] = {k: [] for k in ("image", "text")}
    engine: dict[str, list[float]] = {k: [] for k in ("image", "text")}
    with running_proxy(config) as p, httpx.Client() as client:
        direct = f"{server.base_url}/v1/chat/completions"
        _post(client, f"{p.url}/rollout/warm/v1/chat/completions", image)  # warm both paths
        p.flush()
        (warm,) = completions_of(read_events(config.log_url, group="warm"), "warm")
        text = _text_like(tokenizer, warm.prompt_length, renders)
        name = server.served_model_name
        _post(client, direct, text, name)
        for i in range(calls):
            for kind, messages in (("image", image), ("text", text)):
                url = f"{p.url}/rollout/{kind}-{i}/v1/chat/completions"
                times[kind].append(_post(client, url, messages))
                engine[kind].append(_post(client, direct, messages, name))
        p.flush()
        events = read_events(config.log_url, group="bench", want=2 * calls + 1)
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    assert isinstance(image_token, int)
    for i in range(calls):  # proof of path
        (im,) = completions_of(events, f"image-{i}")
        (tx,) = completions_of(events, f"text-{i}")
        assert im.image_ids and Reconstructor().prompt(im).count(image_token) > 0
        assert not tx.image_ids and tx.prompt_length == im.prompt_length
    p50 = {
        f"{k}/{where}": statistics.median(v) * 1000
        for k in times
        for where, v in (("proxy", times[k]), ("engine", engine[k]))
    }
    return {"p50_ms": p50, "prompt_tokens": warm.prompt_length, "png_bytes": len(png)}


def storage(server: VLLMServer, shots: list[bytes], root: Path) -> dict[str, Any]:
    config = proxy_config(server.base_url, root, auto_register=True)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    with running_proxy(config) as p, httpx.Client() as client:
        url = f"{p.url}/rollout/steps/v1/chat/completions"
        for shot in shots:
            messages.append(_image_message(shot))
            body = {"model": "m", "messages": messages, "max_tokens": 4, "temperature": 1.0}
            resp = client.post(url, json=body, timeout=300)
            resp.raise_for_status()
            answer = resp.json()["choices"][0]["message"]
            messages.append({"role": "assistant", "content": answer.get("content") or ""})
        p.flush()
        events = completions_of(read_events(config.log_url, want=len(shots)), "steps")
    assert [len(e.image_ids) for e in events] == list(range(1, len(shots) + 1))  # proof of path
    images, image_bytes = ImageStore(config.images_root()).usage()
    log_root = Path(config.log_url.removeprefix("local:"))
    log_bytes = sum(
        f.stat().st_size for f in log_root.rglob("*") if f.is_file() and "images" not in f.parts
    )
    inline = sum(len(base64.b64encode(s)) for s in shots)
    steps = len(shots)
    return {
        "steps": steps,
        "images_stored": images,
        "store_bytes_per_step": image_bytes / steps,
        "log_bytes_per_step": log_bytes / steps,
        "inline_base64_bytes_per_step": inline / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=20, help="of each kind")
    parser.add_argument("--steps", type=int, default=8, help="screenshot steps")
    args = parser.parse_args()
    model = build_tiny_vlm(cache_dir() / "models" / "tiny-vlm-seed0", tiny_model(4096, 0))
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
        root = Path(tmp)
        shots = screenshots(args.steps, root / "chromium")
        extra = ["--limit-mm-per-prompt", f'{{"image": {max(args.steps, 1)}}}']
        with VLLMServer(model, "tiny-vlm", enable_lora=False, extra_args=extra) as server:
            lat = latency(server, model, shots[0], args.calls, root / "latency")
            store = storage(server, shots, root / "storage")
    p50 = lat["p50_ms"]
    added_image = p50["image/proxy"] - p50["image/engine"]
    added_text = p50["text/proxy"] - p50["text/engine"]
    print(f"prompt: {lat['prompt_tokens']} tokens; screenshot: {lat['png_bytes']} bytes")
    for key, value in p50.items():
        print(f"  {key:14s} p50 {value:7.2f} ms")
    print(f"added by the proxy: image call {added_image:.2f} ms, text call {added_text:.2f} ms")
    print(
        f"storage over {store['steps']} screenshot steps: {store['images_stored']} images, "
        f"{store['store_bytes_per_step']:.0f} B/step in the image store, "
        f"{store['log_bytes_per_step']:.0f} B/step in the event log "
        f"(inline base64 would add {store['inline_base64_bytes_per_step']:.0f} B/step to the log)"
    )


if __name__ == "__main__":
    main()
