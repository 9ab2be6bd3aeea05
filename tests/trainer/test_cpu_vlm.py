"""The CPU backend on samples with images: a browser-like conversation with screenshots goes
through the proxy to the real vLLM serving the tiny VLM; its events assemble into episodes
whose samples hold the screenshots' placeholder tokens and hashes; the trainer reads the
screenshots back from the proxy's image store, runs the model's image processor on them and
recomputes the engine's behavior logprobs to 1e-4 (another image in their place moves them by
more than 1e-3: the pixels count), then makes an off-policy-corrected update. A text model
refuses the sample."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from infra.image_store import ImageStore
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import proxy_config, read_events, running_proxy
from pipeline.assembly import assemble
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
from tests.proxy.test_images_engine import _image_token, data_url, png
from trainer.algorithms import AlgorithmConfig
from trainer.backends.cpu import CPUBackend
from trainer.batch import to_batch


def _screenshot_rollout(server: VLLMServer, tmp: Path) -> tuple[list[Any], ImageStore]:
    """Three calls, each showing one more screenshot; the rollout's records and the store."""
    config = proxy_config(server.base_url, tmp, auto_register=True)
    rid = f"vlm-{uuid.uuid4().hex[:8]}"
    history: list[Any] = [{"role": "system", "content": "You operate a web browser."}]
    with running_proxy(config) as p:
        client = openai.OpenAI(base_url=f"{p.url}/rollout/{rid}/v1", api_key="k")
        for step, label in enumerate(["Shop", "Cart", "Checkout"]):
            image = {"type": "image_url", "image_url": {"url": data_url(png(label))}}
            history.append({"role": "user", "content": [{"type": "text", "text": "Now:"}, image]})
            answer = client.chat.completions.create(
                model="m", messages=history, max_tokens=8, temperature=1.0, seed=step
            )
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
        p.flush()
    records = [r for r in read_events(config.log_url, want=3) if r.rollout_id == rid]
    return [*records, RewardEvent("rw", rid, 1.0, 1)], ImageStore(config.images_root())


def test_the_trainer_recomputes_the_engines_logprobs_on_screenshots_and_updates(
    vlm_server: VLLMServer, tiny_vlm_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    records, store = _screenshot_rollout(vlm_server, tmp_path)
    episode = assemble(records[0].rollout_id, records, created_us=0)
    # The tiny VLM's answers are random tokens (often broken UTF-8) that the engine re-tokenizes
    # otherwise when it renders them back: its prompt ids do not extend the last call's, so each
    # call is a sample of its own (the proxy recorded REWRITTEN), with the screenshots so far.
    assert [len(s.image_ids) for s in episode.samples] == [1, 2, 3]
    batch = to_batch([episode])
    assert batch.size == 3 and all(batch.images_of(i) for i in range(3))
    backend = CPUBackend(tiny_vlm_dir, lora_rank=8, lr=5e-2, images=store)
    generated = batch.response_mask.bool()
    trainer = backend.logprobs(batch)
    gap = (trainer - batch.behavior_logprobs)[generated].abs()
    assert generated.sum() >= 3 and gap.max() < 1e-4, (
        gap
    )  # the engine's (float32 both), from the pixels
    # Another screenshot in the place of the first: other logprobs (the pixels count).
    last = batch.size - 1
    (_, *rest) = batch.images_of(last)
    other, _ = store.put(png("Elsewhere"), "image/png")
    swapped = batch.rows(list(range(batch.size)))
    assert swapped.image_ids is not None
    swapped.image_ids[last] = [other, *rest]
    moved = backend.logprobs(swapped)
    assert (moved - trainer)[last][generated[last]].abs().max() > 1e-3  # 10x the tolerance
    # A placeholder token the model generated is a token, not an image (as in vLLM).
    spoken = batch.rows(list(range(batch.size)))
    at = int(generated[0].nonzero()[0]) + 1  # the first generated token's position
    spoken.input_ids[0, at] = _image_token(tiny_vlm_dir)
    said = backend.logprobs(spoken)
    assert torch.equal(said[0, : at - 1], trainer[0, : at - 1]) and torch.isfinite(said).all()
    # One GRPO group: this rollout rewarded 1, one of its first call alone rewarded 0.
    worse = replace(
        episode,
        samples=episode.samples[:1],
        episode_id="w",
        rollout_id="w",
        reward=0.0,
        group_id="g",
    )
    batch = to_batch([replace(episode, group_id="g"), worse])
    trainer = backend.logprobs(batch)
    generated = batch.response_mask.bool()
    metrics = backend.train_step(batch, AlgorithmConfig())
    assert abs(metrics["actor/behavior_kl"]) < 2e-3
    after = backend.logprobs(batch)
    assert (after - trainer)[generated].abs().max() > 1e-3  # it learned
    assert torch.isfinite(after).all()
    with pytest.raises(ConfigError, match="the policy is a text model"):
        CPUBackend(tiny_model_dir, lora_rank=8).logprobs(batch)
