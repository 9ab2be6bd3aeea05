"""The browser agent on screenshots: each observation is a screenshot of Chromium in the task's
container, sent through the proxy to the real vLLM serving the tiny VLM, in both dialects. The
engine sees each screenshot as its image tokens, every call is recorded with the images' hashes,
each screenshot is stored once, and the rollout ends verified. (The tiny VLM's answers are
noise: no reward is expected of it.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from infra.harnesses import Browser, BrowserAnthropic
from infra.image_store import ImageStore
from infra.local.vllm import VLLMServer
from infra.tasks import load_task
from infra.tiny_vlm import TinyVLMSpec
from openforge.testing.proxy import completions_of, read_events
from orchestrator.rundir import Status
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus
from tests.orchestrator.conftest import ROOT, job

WEB = ROOT / "examples" / "web-tasks"


@pytest.mark.parametrize("harness", [Browser, BrowserAnthropic], ids=["chat", "messages"])
def test_the_browser_agent_on_screenshots_through_the_proxy_with_the_tiny_vlm(
    vlm_server: VLLMServer, tiny_vlm_dir: Path, tmp_path: Path, harness: type[Browser]
) -> None:
    agent = harness(observation="screenshot", max_turns=3, max_tokens=16)
    with job(tmp_path, agent, tiny_vlm_dir, upstream=vlm_server.base_url) as j:
        (record,) = j.run([load_task(WEB / "newsletter-signup")])
        j.proxy.flush()
        events = completions_of(read_events(j.proxy.config.log_url, want=1), record.rollout_id)
        store = ImageStore(j.proxy.config.images_root())
    root = j.out / "rollouts" / record.rollout_id
    lines = [json.loads(x) for x in (root / "agent.out").read_text().splitlines() if x.strip()]
    assert record.status is Status.VERIFIED and record.reward in (0.0, 1.0), record
    assert lines[-1]["type"] == "final", lines[-1]
    steps = [x for x in lines if x["type"] == "step"]
    assert len(events) == len(steps) >= 1
    assert all(e.status is CompletionStatus.OK and e.completion_token_ids for e in events)
    # Each call shows the screenshots so far; the engine saw each as its image tokens.
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_vlm_dir))
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    rebuild = Reconstructor()
    for event in events:
        prompt = rebuild.prompt(event)
        assert len(event.image_ids) >= 1
        assert prompt.count(image_token) == len(event.image_ids) * TinyVLMSpec().image_seq_len
        assert "(see the screenshot)" in tokenizer.decode(prompt)
    # Every screenshot is stored, once: a PNG of the page.
    shots = {sha for e in events for sha in e.image_ids}
    assert store.usage()[0] == len(shots)
    for sha in shots:
        data, media_type = store.get(sha)
        assert media_type == "image/png" and data.startswith(b"\x89PNG")
