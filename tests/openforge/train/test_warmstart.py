"""The echo-words warm start's demonstrations (:mod:`openforge.train.warmstart`): the built-in
agent's own turns, rendered with its prompt, tool and chat template; with ``recovery_fraction``
also the turn after a failed command, showing exactly what the sandbox fault makes the agent
send (:func:`orchestrator.sandbox_faults.failed`)."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.tiny_model import directory_digest
from openforge.train.warm_start_config import WarmStartSection
from openforge.train.warmstart import TARGET, EchoWordsData, cache_key


@pytest.fixture(scope="module")
def data(tiny_model_dir: Path) -> EchoWordsData:
    return EchoWordsData(tiny_model_dir)


def test_a_failed_command_is_shown_as_the_agent_shows_it_and_the_retry_is_the_same_command(
    data: EchoWordsData,
) -> None:
    word = data.words[0]
    (first, command), (second, done), (after, again), (after_too, gave_up) = data._examples(
        word, TARGET
    )
    assert f'"echo {word} > answer.txt"' in data.tok.decode(command)
    assert again == command and gave_up == done == [*data.tok.encode("Done."), data.end]
    assert after == after_too and after[: len(first)] == first and second[: len(first)] == first
    told = data.tok.decode(after[len(first) :])
    assert "exit code: 126" in told and "bash: echo: Resource temporarily unavailable" in told
    assert "exit code: 0" in data.tok.decode(second[len(first) :])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), fraction=st.sampled_from([0.0, 0.3, 1.0]))
def test_failed_commands_are_shown_only_with_a_recovery_fraction(
    data: EchoWordsData, seed: int, fraction: float
) -> None:
    data.recovery_fraction, data.correct_fraction, data.window = fraction, 1.0, 0
    batch = data(random.Random(seed), 200)
    examples = {w: data._examples(w, TARGET) for w in data.words}
    kinds = []
    for prompt, completion in batch:
        word = next(w for w, ex in examples.items() if any(prompt == p for p, _ in ex))
        first, second, again, gave_up = examples[word]
        kind = [first, second, again, gave_up].index((prompt, completion))
        kinds.append(kind)
    after_fault = [k for k in kinds if k >= 2]
    if fraction == 0.0:
        assert not after_fault  # the main job's data, unchanged
    else:
        assert 20 < len(after_fault) < 80  # about a quarter of 200
    if fraction == 1.0:
        assert set(after_fault) == {2}  # always the command again
    assert kinds.count(0) > kinds.count(1) > 0


def test_the_warm_start_without_recovery_keeps_its_cache_key(tiny_model_dir: Path) -> None:
    """recovery_fraction 0 (the default) keys the model as before the setting existed; any other
    value keys a model of its own, on the same first phases."""
    plain = WarmStartSection()
    recovering = replace(plain, recovery_fraction=0.3)
    assert cache_key(tiny_model_dir, plain) != cache_key(tiny_model_dir, recovering)
    assert cache_key(tiny_model_dir, plain, 1) == cache_key(tiny_model_dir, recovering, 1)
    # The key as it was computed before (the cached warm starts of every config stay valid).
    before = {
        k: str(v) for k, v in vars(plain).items() if k not in ("recovery_fraction", "baseline")
    }
    blob = json.dumps(
        {"base": directory_digest(tiny_model_dir), "warm_start": before, "format": 2},
        sort_keys=True,
    )
    assert cache_key(tiny_model_dir, plain) == hashlib.sha256(blob.encode()).hexdigest()[:16]
