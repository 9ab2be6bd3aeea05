"""Fixtures for the harness tests: the installed harnesses (the long-context vLLM their prompts
need is ``long_vllm``, tests/conftest.py)."""

from __future__ import annotations

import pytest

from infra.harnesses import HARNESSES, Harness, model_harnesses


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
