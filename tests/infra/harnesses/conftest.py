"""Fixtures for the harness tests: a long-context vLLM and the installed harnesses.

The harnesses' own system prompts and tool lists are 17k-31k tokens with the tiny model's
tokenizer, past the suite's 4096-token server: these tests get their own vLLM, on the same tiny
weights with a 64k context, for this module set only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.harnesses import HARNESSES, Harness, model_harnesses
from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.tiny_model import TinyModelSpec, build_tiny_model

LONG_CONTEXT = 65536


@pytest.fixture(scope="session")
def long_model_dir() -> Path:
    """The tiny model (same seed, same weights) with a 64k-token context."""
    spec = TinyModelSpec(max_position_embeddings=LONG_CONTEXT)
    return build_tiny_model(default_tiny_dir(0, LONG_CONTEXT), seed=0, spec=spec)


@pytest.fixture(scope="package")
def long_vllm(long_model_dir: Path) -> Iterator[VLLMServer]:
    with VLLMServer(
        long_model_dir, served_model_name="tiny", max_model_len=LONG_CONTEXT, enable_lora=False
    ) as server:
        yield server


def installed(name: str) -> Harness:
    """The harness ``name``; fails (with the set-up command to run) if it is not installed."""
    h = HARNESSES[name]()
    h.executable()
    if h.node_bin_dir() is not None:
        assert (h.node_bin_dir() / "node").exists()  # type: ignore[operator]
    return h


@pytest.fixture(params=model_harnesses())
def harness(request: pytest.FixtureRequest) -> Harness:
    """Each harness that calls a model, in turn (the oracle has its own tests)."""
    return installed(request.param)
