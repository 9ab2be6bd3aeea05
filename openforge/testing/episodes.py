"""A fixed batch of episodes for weight-sync checks (tests and ``bench/weight_sync.py``)."""

from __future__ import annotations

import numpy as np

from schemas.episode import Episode, Sample


def fixed_episodes() -> list[Episode]:
    """Four one-sample episodes of 24 random tokens (12 prompt, 12 generated), seed 0."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(4):
        tokens = rng.integers(10, 400, size=24).tolist()
        mask = [0] * 12 + [1] * 12
        out.append(
            Episode(
                f"e{i}",
                f"r{i}",
                [Sample(0, tokens, mask, [-5.0 if m else 0.0 for m in mask])],
                float(i % 2),
                0,
                task_id="t",
            )
        )
    return out
