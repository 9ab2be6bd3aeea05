"""The harness-traffic warm start's demonstrations, with each real harness binary (lean prompt)
playing echo-words tasks in their own image through a real proxy, against the scripted teacher
(issue 49 allows a scripted model policy for this): the demonstrations are the harness's own
calls, recorded token for token, assembled as the pipeline assembles them, and labelled by the
verifier's reward; a few SFT steps on them make a model vLLM can load."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from infra.eventlog import EVENTS_TOPIC, records_in
from infra.harnesses import HARNESSES, NpmHarness, PromptProfile
from openforge.stack import tiny_model
from openforge.train.demonstrations import Demonstration, DemoSettings, _kept, record
from openforge.train.harness_warmstart import (
    Best,
    DemoData,
    Phase,
    _phase,
    cache_key,
    fork,
    harness_warm_start,
)
from openforge.train.teacher import TARGET
from openforge.train.warm_start_config import WarmStartRecipe, WarmStartSection
from orchestrator.rundir import RolloutOutcome, Status
from schemas.completion import CompletionEvent
from schemas.delta import Reconstructor
from schemas.enums import CompletionStatus
from schemas.errors import ConfigError, ServiceError

WORDS = ["water", "code"]
CONTEXT = 8192


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model(CONTEXT)


@pytest.mark.parametrize("name", ["codex", "claude-code", "openclaw"])
def test_demonstrations_are_the_harness_own_recorded_calls(
    name: str, model_dir: Path, tmp_path: Path
) -> None:
    harness = HARNESSES[name](prompt=PromptProfile.LEAN)  # type: ignore[call-arg]
    assert isinstance(harness, NpmHarness) and harness.shell_tool is not None
    out = tmp_path / "demos"
    # Three times the tasks' 120 s: under the other worker's load, OpenClaw was stopped by the
    # timeout after the teacher's call and before running it (the correct call read as wrong).
    play = DemoSettings(per_word=2, context=CONTEXT, agent_timeout_multiplier=3)
    demos = record(harness, model_dir, WORDS, play, out)

    # Every rollout verified: the teacher's first call for a word writes answer.txt, its second
    # a wrong file, and the verifier's reward tells them apart.
    assert sorted((d.word, d.correct) for d in demos) == sorted(
        (w, c) for w in WORDS for c in (True, False)
    )
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    records = list(records_in(f"local:{out / 'log'}", EVENTS_TOPIC))
    for demo in demos:
        calls = sorted(
            (
                r
                for r in records
                if isinstance(r, CompletionEvent) and r.rollout_id == demo.rollout_id
            ),
            key=lambda e: e.call_index,
        )
        main = [c for c in calls if not c.side_call and c.status is CompletionStatus.OK]
        assert len(main) >= 2 and all(c.harness == name for c in calls)
        # The first call is the harness's own prompt, with its shell tool, and the teacher's
        # answer is one call of that tool in the harness's own argument.
        rebuild = Reconstructor()
        prompts = [rebuild.add(c)[0] for c in calls]
        first = str(tok.decode(prompts[calls.index(main[0])]))
        assert f'"name": "{harness.shell_tool.name}"' in first
        assert f"Write the word {demo.word} to answer.txt." in first
        answer = str(tok.decode(main[0].completion_token_ids, skip_special_tokens=True))
        call = json.loads(answer.split("<tool_call>")[1].split("</tool_call>")[0])
        assert call["name"] == harness.shell_tool.name
        command = call["arguments"][harness.shell_tool.argument]
        assert command.startswith(f"echo {demo.word} > ")
        assert (command == f"echo {demo.word} > {TARGET}") is demo.correct
        # Each sample is tokens the proxy recorded: every masked token is a generated one, and
        # the masked tokens are exactly the calls' completions, in order.
        trained = [t for ids, mask in demo.samples for t, m in zip(ids, mask, strict=True) if m]
        generated = [t for c in main for t in c.completion_token_ids]
        assert sorted(trained) == sorted(generated)
        for ids, _ in demo.samples:
            assert any(ids[: len(p)] == p for p in prompts if p)


def test_a_short_warm_start_makes_a_model_and_is_cached(model_dir: Path, tmp_path: Path) -> None:
    harness = HARNESSES["codex"](prompt=PromptProfile.LEAN)  # type: ignore[call-arg]
    ws = WarmStartSection(
        recipe=WarmStartRecipe.HARNESS_TRAFFIC, steps=2, noisy_steps=1, correct_fraction=0.5,
        batch=2, window=16, window_steps=2,
    )  # fmt: skip
    said: list[str] = []
    play = DemoSettings(per_word=2, context=CONTEXT)
    cache = tmp_path / "models"
    words = ["water", "code", "file"]
    out = harness_warm_start(model_dir, ws, harness, play, cache, said.append, words)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert any("2 correct" in s or "3 correct" in s for s in said), said
    # The sequence-length warmup ran first, then the whole sequences, then the noisy mix.
    phases = [s.split(":")[0].strip() for s in said if s.strip().startswith("SFT phase")]
    assert phases[0] == "SFT phase 1a" and phases[-1] == "SFT phase 2", said
    assert "1: step 2/2" in "".join(said), said
    again: list[str] = []
    assert harness_warm_start(model_dir, ws, harness, play, cache, again.append, words) == out
    assert again == [f"warm start: reusing {out}"]


def test_probes_and_forks_read_the_sample_that_acts_not_a_title_before_it() -> None:
    """OpenCode's demonstrations start with a title request (a few trained tokens in a thread
    of their own) and end with "Done." in another: the probe is the tool call's sample."""
    title = ([1, 2, 3, 9], [0, 0, 1, 1])
    call = ([4, 5, 6, 7, 8, 20], [0, 0, 1, 1, 1, 1])
    done = ([4, 5, 6, 7, 8, 20, 30, 31], [0, 0, 0, 0, 0, 0, 1, 1])
    good = Demonstration("a", "w", True, [title, call, done])
    bad = Demonstration("b", "w", False, [title, ([*call[0][:-1], 21], call[1]), done])
    assert good.acting() == call
    data = DemoData([good, bad], probes=1, seed=0)
    assert [list(p.ids) for p in data.probes] == [call[0]]
    assert fork(good, bad) == call[0] and data.forks == [call[0]]


def test_the_warm_started_model_is_keyed_by_its_demonstrations(model_dir: Path) -> None:
    """Demonstrations recorded again (another teacher name, more plays) make another model:
    a cached one fine-tuned on the old recordings is never reused."""
    harness = HARNESSES["openclaw"](prompt=PromptProfile.LEAN)  # type: ignore[call-arg]
    ws = WarmStartSection(recipe=WarmStartRecipe.HARNESS_TRAFFIC)
    for phase in (0, 1, 2):
        keys = {cache_key(model_dir, ws, harness, demos, phase) for demos in ("d1", "d2")}
        assert len(keys) == 2


def test_each_phase_is_keyed_by_its_own_settings_and_the_earlier_phases(model_dir: Path) -> None:
    """The window warmup's model (phase 0) does not depend on the whole sequences' or the
    noisy mix's settings, the exact phase's (1) not on the noisy mix's; each depends on its
    own and the earlier phases'."""
    harness = HARNESSES["openclaw"](prompt=PromptProfile.LEAN)  # type: ignore[call-arg]
    ws = WarmStartSection(recipe=WarmStartRecipe.HARNESS_TRAFFIC)
    changes = {
        "window_steps": 301, "window_max_steps": 900, "steps": 1001, "exact_lr": 1e-3,
        "noisy_steps": 101, "noisy_lr": 1e-4, "correct_fraction": 0.5,
    }  # fmt: skip
    decides = {0: {"window_steps", "window_max_steps"}, 1: {"window_steps", "window_max_steps",
               "steps", "exact_lr"}, 2: set(changes)}  # fmt: skip
    for phase, own in decides.items():
        key = cache_key(model_dir, ws, harness, "d", phase)
        for name, value in changes.items():
            other = cache_key(
                model_dir, dataclasses.replace(ws, **{name: value}), harness, "d", phase
            )
            assert (other != key) == (name in own), (phase, name)


def test_the_window_warmup_goes_on_past_its_steps_only_until_its_windows_are_reproduced(
    model_dir: Path, tmp_path: Path
) -> None:
    """``window_max_steps``: past ``window_steps``, the warmup is asked every 50 steps whether
    greedy decoding reproduces the probes' windows, and stops at the first yes (or at the
    maximum); never asked before its own steps are done."""
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    demos = []
    for i, word in enumerate(["water", "code", "file", "the"]):
        prompt = tok.encode(" ".join(["filler"] * 40) + f" write {word} now")
        answer = tok.encode(f" echo {word}")
        ids, mask = prompt + answer, [0] * len(prompt) + [1] * len(answer)
        demos.append(Demonstration(f"r{i}", word, True, [(ids, mask)]))
    data = DemoData(demos, probes=4, seed=0)
    data.window = 8  # the probes are windowed as the samples are
    assert all(list(p.mask).index(1) == 8 for p in map(data._windowed, data.probes))
    said: list[str] = []
    ws = WarmStartSection(
        recipe=WarmStartRecipe.HARNESS_TRAFFIC, batch=4, window=8, window_steps=100,
        window_max_steps=400, lr=3e-3,
    )  # fmt: skip
    _phase(model_dir, tmp_path / "warm", data, ws, Phase.WINDOW, said.append)
    asked = [s for s in said if "greedy decoding reproduces" in s]
    steps = [int(s.split("step ")[1].split("/")[0]) for s in said if " step " in s]
    # Asked every 50 steps from step 100 on (not at 50: the warmup's own steps come first).
    assert asked and "phase 1a" in asked[0] and steps[-1] <= 400
    assert len(asked) == steps[-1] // 50 - 1, said
    rates = [float(s.split("reproduces ")[1].split(" ")[0]) for s in asked]
    assert all(r < 0.9 for r in rates[:-1]) and (rates[-1] >= 0.9 or steps[-1] == 400), said


def test_a_phase_that_misses_its_target_keeps_its_best_checks_model(
    model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    shutil.copytree(model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    first = {k: v.clone() for k, v in model.state_dict().items()}
    best, said = Best(), []
    best.saw(model, 0.5, 50)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    best.saw(model, 0.25, 100)  # the last check, worse: its model is what the phase wrote
    model.save_pretrained(str(out))
    assert best.kept(out, Phase.EXACT, said.append) == out
    kept = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert all(torch.equal(kept[k], v) for k, v in first.items())
    assert said == ["  SFT phase 1: kept step 50's model (0.50 of the probes)"]
    again = Best()  # the last check the best (or equal): the phase's own model stands
    again.saw(model, 0.25, 50)
    again.saw(model, 0.25, 100)
    assert again.kept(out, Phase.EXACT, said.append) == out and len(said) == 1


def test_a_demonstration_is_a_verified_rollout_whose_harness_finished(tmp_path: Path) -> None:
    """A harness stopped by its timeout may not have run the teacher's call: its reward says
    nothing of the call, so it is no demonstration; none left is an error that says what to do."""
    harness = HARNESSES["openclaw"](prompt=PromptProfile.LEAN)  # type: ignore[call-arg]

    def ended(rid: str, status: Status, phase: str | None) -> RolloutOutcome:
        return RolloutOutcome(rid, "echo-w", "g", 0, 1, status, agent_phase=phase)

    outcomes = [
        ended("a", Status.VERIFIED, "finished"),
        ended("b", Status.VERIFIED, "timed_out"),
        ended("c", Status.INFRA_FAILED, None),
    ]
    assert _kept(harness, outcomes, tmp_path) == {"a"}
    with pytest.raises(ServiceError, match="agent_timeout_multiplier"):
        _kept(harness, outcomes[1:], tmp_path)


def test_no_correct_demonstration_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no correct demonstration"):
        DemoData([], probes=4, seed=0)


@settings(max_examples=50, deadline=None)
@given(
    before=st.integers(0, 300),
    answers=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9)), min_size=1, max_size=3),
    window=st.integers(1, 100),
)
def test_the_window_keeps_the_tokens_before_the_first_answer_and_everything_after(
    before: int, answers: list[tuple[int, int]], window: int
) -> None:
    """The warmup's sample: ``window`` tokens (or all there are) before the first trained
    token, then the rest of the recorded sequence as it is, its loss mask with it."""
    ids, mask = list(range(before)), [0] * before
    for trained, context in answers:  # an answer, then what the harness sent back
        mask += [1] * trained + [0] * context
        ids += list(range(len(ids), len(ids) + trained + context))
    demo = Demonstration("r", "w", True, [(ids, mask)])
    data = DemoData([demo], probes=1, seed=0)
    data.window = window
    (sample,) = data(random.Random(0), 1)
    kept = min(before, window)
    assert list(sample.ids) == ids[before - kept :]
    assert list(sample.mask) == mask[before - kept :]
    data.window = 0
    assert list(data(random.Random(0), 1)[0].ids) == ids


@settings(max_examples=50, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 50), min_size=1, max_size=40),
    shared=st.lists(st.integers(0, 50), max_size=10),
    right=st.integers(51, 60),
    wrong=st.integers(61, 70),
)
def test_a_fork_is_where_the_correct_and_the_imperfect_answer_part(
    prompt: list[int], shared: list[int], right: int, wrong: int
) -> None:
    """The noisy phase's measure: the correct demonstration up to the first answer token the
    imperfect one of the same word does not share; none if they part in the prompt."""
    mask = [0] * len(prompt) + [1] * (len(shared) + 1)
    good = Demonstration("a", "w", True, [([*prompt, *shared, right], mask)])
    bad = Demonstration("b", "w", False, [([*prompt, *shared, wrong], mask)])
    assert fork(good, bad) == [*prompt, *shared, right]
    other = Demonstration("c", "w", False, [([prompt[0] + 100, *prompt[1:], *shared, right], mask)])
    assert fork(good, other) is None
