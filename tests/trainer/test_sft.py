"""The SFT loss: a batch's shared prefix run once gives the full rows' loss and gradients."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from trainer import sft
from trainer.sft import Masked, sequence_loss, shared_prefix


def _rows(seed: int, prefix: int, rows: int) -> list[Masked]:
    rng = random.Random(seed)
    common = [rng.randrange(3, 500) for _ in range(prefix)]
    out = []
    for _ in range(rows):
        prompt = common + [rng.randrange(3, 500) for _ in range(rng.randint(1, 20))]
        completion = [rng.randrange(3, 500) for _ in range(rng.randint(1, 12))]
        tool = [rng.randrange(3, 500) for _ in range(rng.randint(0, 8))]
        answer = [rng.randrange(3, 500) for _ in range(rng.randint(0, 5))]
        ids = [*prompt, *completion, *tool, *answer]
        mask = [0] * len(prompt) + [1] * len(completion) + [0] * len(tool) + [1] * len(answer)
        out.append(Masked(ids, mask))
    return out


def _loss_and_grads(model: Any, batch: list[Masked]) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    loss = sequence_loss(model, batch)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("prefix", [80, 300])
def test_shared_prefix_gives_the_full_rows_loss_and_gradients(
    tiny_model_dir: Path, prefix: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    batch = _rows(prefix, prefix, rows=3)
    assert shared_prefix(batch) >= prefix  # the run-once path is taken
    shared, shared_grads = _loss_and_grads(model, batch)
    monkeypatch.setattr(sft, "SHARED_PREFIX_MIN", 10**9)  # the full rows, padded
    full, full_grads = _loss_and_grads(model, batch)
    assert shared == pytest.approx(full, rel=1e-5)
    for a, b in zip(shared_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 1), max_size=12)
        ),
        min_size=1,
        max_size=5,
    )
)
def test_shared_prefix_is_common_and_untrained(rows: list[tuple[list[int], list[int]]]) -> None:
    batch = [Masked(ids, (mask + [0] * len(ids))[: len(ids)]) for ids, mask in rows]
    p = shared_prefix(batch)
    assert all(list(e.ids[:p]) == list(batch[0].ids[:p]) for e in batch)
    for e in batch:
        first = next((i for i, m in enumerate(e.mask) if m), len(e.ids))
        assert p <= max(first - 1, 0)


def test_a_pair_is_a_masked_sequence() -> None:
    assert Masked.of(([1, 2], [3])) == Masked([1, 2, 3], [0, 0, 1])
