"""The ``harness-traffic`` warm start: a tiny model fine-tuned on a real harness's own recorded
traffic, the way SFT-then-RL recipes start (issue 49).

1. The real harness binary (the one ``scripts/setup harnesses`` installs, unmodified, with the
   run's prompt profile) plays echo-words demonstration tasks, one per one-token word of the
   tiny model (held-out words included, as in the ``echo-words`` recipe: copying the word is
   the baseline's knowledge), each ``per_word`` times in the task's own image, through a real
   capture proxy whose upstream is the scripted teacher (:mod:`openforge.train.teacher`): one
   call of the harness's own shell tool, ``echo W > FILE``, then ``Done.``; FILE is the
   instructed ``answer.txt`` in half of them and a wrong file in the other half.
2. The recorded rollouts become episodes exactly as the pipeline assembles them
   (:mod:`openforge.train.demonstrations`): the very token sequences and loss masks RL trains
   on. The verifier's reward tells the correct demonstrations from the imperfect ones.
3. SFT (:func:`trainer.sft.fine_tune`, the harness's shared prompt prefix run once per batch) on
   correct demonstrations, first as a sequence-length warmup: ``window_steps`` steps on each
   sample from ``window`` tokens before its first answer (the instruction and the answers, the
   harness's long system prompt and tools left out), and with ``window_max_steps`` on from there
   until greedy decoding reproduces 90% of the probes' windows (checked every 50 steps; that
   many steps in all at most: how many it takes varies from one recording to the next), then
   on the whole recorded sequences until
   teacher-forced greedy decoding reproduces 90% of 16 probe demonstrations exactly (checked
   every 50 steps; ``steps`` at most); then ``noisy_steps`` on a mix that is correct
   ``correct_fraction`` of the time (at ``noisy_lr`` when set). The warm-started policy has the
   skill but seldom writes the instructed file: RL has to make it reliable. With ``baseline``
   the noisy phase stops at the first check (every 5 steps) where the instructed file's
   probability (at the token where a word's correct and imperfect demonstrations part, over the
   probes' words) is within [baseline / 2, baseline]: that one decision swings by tenths from
   one step to the next, so a fixed step count gives an arbitrary baseline and a measured stop a
   stated one.

   Why the warmup: copying the word means attending from the answer to one token among the
   harness's thousands; from a random model that attention gets ~1/length of the gradient,
   and on the whole sequences alone the copying did not form, where on the short windows it
   does and then carries over (the figures: bench/RESULTS.md, "Training in the real
   harnesses").

The result is cached by what decides it: the base model, the settings, the harness, its
version, its prompt profile and its adapter's source (its config and flags).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import random
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from openforge.train.config import POLICY
from openforge.train.demonstrations import Demonstration, DemoSettings, record
from openforge.train.warm_start_config import WarmStartSection
from schemas.errors import ConfigError
from trainer.sft import Masked, SFTConfig, fine_tune

EXACT_RATE = 0.9  # phase 1 ends once greedy decoding reproduces this share of the probes
EXACT_CHECK_EVERY = 50  # phase 1 asks this often whether the probes are reproduced
NOISY_CHECK_EVERY = 5  # phase 2 asks this often whether the baseline is reached
PROBES = 16


def demo_words(model_dir: Path) -> list[str]:
    """The tiny model's one-token words (with the leading space they have in a command)."""
    from transformers import AutoTokenizer

    from infra.tiny_model import corpus_words

    tok: Any = AutoTokenizer.from_pretrained(str(model_dir))
    return sorted(w for w in corpus_words() if w.isalpha() and len(tok.encode(" " + w)) == 1)


def _harness_key(base: Path, harness: Harness) -> dict[str, Any]:
    """What decides a harness's traffic on ``base``: the base's files, the harness, its version,
    its prompt profile and its adapter's source (its config and flags: a change to it records
    the demonstrations again)."""
    from infra.tiny_model import directory_digest

    prompt = getattr(harness, "prompt", None)
    adapter = Path(inspect.getfile(type(harness))).read_bytes()
    return {
        "base": directory_digest(base),
        "harness": [harness.name, harness.version, str(prompt)],
        "adapter": hashlib.sha256(adapter).hexdigest(),
    }


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_key(
    base: Path, ws: WarmStartSection, harness: Harness, demos: str, phase: int = 2
) -> str:
    """What decides the warm-started model (``phase=1``: the exact phase's model alone;
    ``phase=0``: the window warmup's): the demonstrations it is fine-tuned on (``demos``, their
    :func:`demos_key`) and the settings of its phases."""
    settings = {k: str(v) for k, v in vars(ws).items()}
    later = {
        0: ("steps", "exact_lr", "noisy_steps", "correct_fraction", "baseline", "noisy_lr"),
        1: ("noisy_steps", "correct_fraction", "baseline", "noisy_lr"),
    }  # the settings of later phases do not decide an earlier phase's model
    for name in later.get(phase, ()):
        settings.pop(name)
    for name in (
        "exact_lr",
        "window_max_steps",
        "recovery_fraction",
    ):  # added later: at their default
        if settings.get(name) in ("0", "0.0"):  # (off): the key they had before, kept
            settings.pop(name)
    # format 2: the probes and forks read each demonstration's acting sample, not its first;
    # 3: a reproduction phase that misses its target keeps its best check's model
    key = {**_harness_key(base, harness), "warm_start": settings, "phase": phase, "format": 3}
    return _digest({**key, "demos": demos})


def demos_key(base: Path, harness: Harness, words: Sequence[str], play: DemoSettings) -> str:
    """What decides the recorded demonstrations: the harness on the base, the words and how
    many times each is played; not the SFT settings, so tuning those records nothing again."""
    key = {**_harness_key(base, harness), "words": list(words), "per_word": play.per_word}
    # the model name the teacher is served under (and the policy later): in some prompts
    return _digest({**key, "model": POLICY, "format": 1})


class DemoData:
    """Draws batches of recorded samples for ``fine_tune``: correct demonstrations with
    probability ``correct_fraction``, imperfect ones otherwise."""

    def __init__(self, demos: list[Demonstration], probes: int, seed: int) -> None:
        self.window = 0  # > 0: each sample from this many tokens before its first answer
        self.correct = [d for d in demos if d.correct]
        self.wrong = [d for d in demos if not d.correct]
        if not self.correct:
            raise ConfigError("no correct demonstration was recorded: see the rollouts' logs")
        rng = random.Random(seed)
        chosen = rng.sample(self.correct, min(probes, len(self.correct)))
        self.probes = [Masked(*d.acting()) for d in chosen]
        wrong_of = {d.word: d for d in self.wrong}
        self.forks = [f for d in chosen if d.word in wrong_of and (f := fork(d, wrong_of[d.word]))]
        self.correct_fraction = 1.0

    def __call__(self, rng: random.Random, batch: int) -> list[Masked]:
        out = []
        for _ in range(batch):
            wrong = self.wrong and rng.random() >= self.correct_fraction
            demo = rng.choice(self.wrong if wrong else self.correct)
            out.append(self._windowed(Masked(*rng.choice(demo.samples))))
        return out

    def _windowed(self, sample: Masked) -> Masked:
        if not self.window:
            return sample
        cut = max(0, list(sample.mask).index(1) - self.window)
        return Masked(sample.ids[cut:], sample.mask[cut:])

    def instructed_rate(self, model: Any) -> float | None:
        """The mean probability, over the probes' words, that the model's answer takes the
        correct demonstration's way where the imperfect one of the same word parts from it
        (the file it writes): how often sampling at temperature 1 writes the instructed file.
        None when no word has both demonstrations."""
        import torch

        if not self.forks:
            return None
        total = 0.0
        for ids in self.forks:
            logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0, -1]
            total += float(torch.softmax(logits.float(), -1)[ids[-1]])
        return total / len(self.forks)

    def exact_rate(self, model: Any) -> float:
        """How many probes teacher-forced greedy decoding reproduces token for token (each
        probe windowed as the samples are, while a window is set)."""
        import torch

        hits = 0
        for probe in map(self._windowed, self.probes):
            ids = torch.tensor([list(probe.ids)])
            predicted = model(input_ids=ids).logits[0, :-1].argmax(-1)
            trained = torch.tensor(list(probe.mask[1:]), dtype=torch.bool)
            hits += bool((predicted[trained] == ids[0, 1:][trained]).all())
        return hits / len(self.probes)


def harness_warm_start(
    base: Path,
    ws: WarmStartSection,
    harness: Harness,
    play: DemoSettings,
    cache: Path,
    say: Callable[[str], None] = print,
    words: Sequence[str] | None = None,
) -> Path:
    """The model warm-started on ``harness``'s recorded traffic, built once (cached);
    ``words``: the demonstrations' words (default: :func:`demo_words`)."""
    words = list(words if words is not None else demo_words(base))
    demos_id = demos_key(base, harness, words, play)
    out = cache / f"warm-{harness.name}-{cache_key(base, ws, harness, demos_id)}"
    if (out / "config.json").exists():
        say(f"warm start: reusing {out}")
        return out
    say(
        f"warm start: {harness.name} plays {len(words)} echo-words demonstrations x "
        f"{play.per_word} against the scripted teacher, recorded by the proxy; then "
        f"{ws.steps} + {ws.noisy_steps} SFT steps on the recorded tokens (cached for later runs)"
    )
    key1 = cache_key(base, ws, harness, demos_id, phase=1)
    exact = cache / f"warm-{harness.name}-exact-{key1}"
    demos_dir = cache / f"demos-{harness.name}-{demos_id}"
    demos = recorded(harness, base, words, play, demos_dir, say)
    data = DemoData(demos, PROBES, ws.seed)
    say(f"  {len(data.correct)} correct and {len(data.wrong)} imperfect demonstrations")
    if (exact / "config.json").exists():
        say(f"  SFT phase 1: reusing {exact}")
    else:
        current = base
        if ws.window and ws.window_steps:
            data.window = ws.window
            key0 = cache_key(base, ws, harness, demos_id, phase=0)
            current = cache / f"warm-{harness.name}-window-{key0}"
            if (current / "config.json").exists():  # another whole-sequence recipe after it
                say(f"  SFT phase 1a: reusing {current}")
            else:
                _phase(base, current, data, ws, Phase.WINDOW, say)
            data.window = 0
        _phase(current, exact, data, ws, Phase.EXACT, say)
    data.correct_fraction = ws.correct_fraction
    return _phase(exact, out, data, ws, Phase.NOISY, say)


def recorded(
    harness: Harness,
    base: Path,
    words: list[str],
    play: DemoSettings,
    out: Path,
    say: Callable[[str], None],
) -> list[Demonstration]:
    """The demonstrations recorded under ``out`` (``demonstrations.json``), recorded first if
    they are not there yet."""
    saved = out / "demonstrations.json"
    if saved.exists():
        say(f"  demonstrations: reusing {saved}")
        return [Demonstration(**d) for d in json.loads(saved.read_text())]
    demos = record(harness, base, words, play, out, say)
    saved.write_text(json.dumps([dataclasses.asdict(d) for d in demos]))
    return demos


def fork(correct: Demonstration, wrong: Demonstration) -> list[int] | None:
    """The correct demonstration's acting sample up to the first token where the imperfect
    one's (of the same word) differs, that token included; None if they do not part at a
    trained token (another difference came first)."""
    (a, mask), (b, _) = correct.acting(), wrong.acting()
    i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    return list(a[: i + 1]) if i is not None and mask[i] else None


class Phase(Enum):
    WINDOW = "1a"  # the sequence-length warmup on correct demonstrations
    EXACT = "1"  # the whole sequences of correct demonstrations, until they are reproduced
    NOISY = "2"  # the mix that is correct correct_fraction of the time


def _phase(
    model_dir: Path,
    out: Path,
    data: DemoData,
    ws: WarmStartSection,
    phase: Phase,
    say: Callable[[str], None],
) -> Path:
    window = max(ws.window_steps, ws.window_max_steps)
    steps = {Phase.WINDOW: window, Phase.EXACT: ws.steps, Phase.NOISY: ws.noisy_steps}
    total = steps[phase]
    what = f" (the last {data.window} tokens before the answers)" if data.window else ""
    at = [0]  # the step reached

    def report(step: int, loss: float) -> None:
        at[0] = step
        if step % 50 == 0 or step == total:
            say(f"  SFT phase {phase.value}: step {step}/{total}{what}, loss {loss:.3f}")

    def reproduces(model: Any) -> bool:
        if phase is Phase.WINDOW and at[0] < ws.window_steps:
            return False  # the warmup's own steps first; only past them is it asked
        rate = data.exact_rate(model)
        say(
            f"  SFT phase {phase.value}: greedy decoding reproduces {rate:.2f} of "
            f"{len(data.probes)} probes{what}"
        )
        best.saw(model, rate, at[0])
        return rate >= EXACT_RATE

    def calibrated(model: Any) -> bool:
        rate = data.instructed_rate(model)
        if rate is None:
            return False
        low, high = ws.baseline / 2, ws.baseline
        say(f"  SFT phase 2: the instructed file's probability {rate:.3f} (stop: {low}-{high})")
        return low <= rate <= high

    best = Best()
    done: Callable[[Any], bool] | None = None
    every = EXACT_CHECK_EVERY
    if phase in (Phase.WINDOW, Phase.EXACT):
        done = reproduces
    elif phase is Phase.NOISY and ws.baseline > 0:
        done, every = calibrated, NOISY_CHECK_EVERY
    seed = ws.seed + list(Phase).index(phase)
    own = {Phase.EXACT: ws.exact_lr, Phase.NOISY: ws.noisy_lr}.get(phase, 0.0)
    lr = own if own > 0 else ws.lr
    cfg = SFTConfig(steps=total, batch=ws.batch, lr=lr, seed=seed)
    fine_tune(model_dir, out, data, cfg, on_step=report, done=done, check_every=every)
    return best.kept(out, phase, say)


class Best:
    """The model a reproduction phase keeps: where its probes swing from one check to the next
    (2 to 9 of 16 and back), the phase's last model is an arbitrary draw; if no check reached
    the target, the model of the best check (the latest of equals) is kept instead."""

    def __init__(self) -> None:
        self.rate, self.last, self.step = -1.0, -1.0, 0
        self.state: dict[str, Any] | None = None

    def saw(self, model: Any, rate: float, step: int) -> None:
        self.last = rate
        if rate >= self.rate:
            self.rate, self.step = rate, step
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def kept(self, out: Path, phase: Phase, say: Callable[[str], None]) -> Path:
        """``out``, holding the best check's model if it beat the last check."""
        if self.state is None or self.rate <= self.last:
            return out
        import torch
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
        model.load_state_dict(self.state)  # as fine_tune trains and saves it: float32
        model.save_pretrained(str(out), safe_serialization=True)
        say(
            f"  SFT phase {phase.value}: kept step {self.step}'s model ({self.rate:.2f} of the "
            "probes)"
        )
        return out
