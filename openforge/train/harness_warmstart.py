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
3. SFT in two phases (:func:`trainer.sft.fine_tune`, the harness's shared prompt prefix run
   once per batch): on correct demonstrations until teacher-forced greedy decoding reproduces
   90% of 16 probe demonstrations exactly (checked every 50 steps; ``steps`` at most), then
   ``noisy_steps`` on a mix that is correct ``correct_fraction`` of the time. The warm-started
   policy has the skill but seldom writes the instructed file: RL has to make it reliable.

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
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from openforge.train.config import WarmStartSection
from openforge.train.demonstrations import Demonstration, DemoSettings, record
from schemas.errors import ConfigError
from trainer.sft import Masked, SFTConfig, fine_tune

EXACT_RATE = 0.9  # phase 1 ends once greedy decoding reproduces this share of the probes
PROBES = 16


def demo_words(model_dir: Path) -> list[str]:
    """The tiny model's one-token words (with the leading space they have in a command)."""
    from transformers import AutoTokenizer

    from infra.tiny_model import corpus_words

    tok: Any = AutoTokenizer.from_pretrained(str(model_dir))
    return sorted(w for w in corpus_words() if w.isalpha() and len(tok.encode(" " + w)) == 1)


def cache_key(base: Path, ws: WarmStartSection, harness: Harness, phase: int = 2) -> str:
    """What decides the warm-started model (``phase=1``: the exact phase's model alone)."""
    from infra.tiny_model import directory_digest

    settings = {k: str(v) for k, v in vars(ws).items()}
    if phase == 1:
        settings.pop("noisy_steps")
        settings.pop("correct_fraction")
    prompt = getattr(harness, "prompt", None)
    # The adapter's source decides the harness's settings (its config and flags): a change to it
    # records the demonstrations again.
    adapter = Path(inspect.getfile(type(harness))).read_bytes()
    key = {
        "base": directory_digest(base),
        "warm_start": settings,
        "harness": [harness.name, harness.version, str(prompt)],
        "adapter": hashlib.sha256(adapter).hexdigest(),
        "phase": phase,
        "format": 1,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


class DemoData:
    """Draws batches of recorded samples for ``fine_tune``: correct demonstrations with
    probability ``correct_fraction``, imperfect ones otherwise."""

    def __init__(self, demos: list[Demonstration], probes: int, seed: int) -> None:
        self.correct = [d for d in demos if d.correct]
        self.wrong = [d for d in demos if not d.correct]
        if not self.correct:
            raise ConfigError("no correct demonstration was recorded: see the rollouts' logs")
        rng = random.Random(seed)
        self.probes = [
            Masked(*d.samples[0]) for d in rng.sample(self.correct, min(probes, len(self.correct)))
        ]
        self.correct_fraction = 1.0

    def __call__(self, rng: random.Random, batch: int) -> list[Masked]:
        out = []
        for _ in range(batch):
            wrong = self.wrong and rng.random() >= self.correct_fraction
            demo = rng.choice(self.wrong if wrong else self.correct)
            out.append(Masked(*rng.choice(demo.samples)))
        return out

    def exact_rate(self, model: Any) -> float:
        """How many probes teacher-forced greedy decoding reproduces token for token."""
        import torch

        hits = 0
        for probe in self.probes:
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
    out = cache / f"warm-{harness.name}-{cache_key(base, ws, harness)}"
    if (out / "config.json").exists():
        say(f"warm start: reusing {out}")
        return out
    words = list(words if words is not None else demo_words(base))
    say(
        f"warm start: {harness.name} plays {len(words)} echo-words demonstrations x "
        f"{play.per_word} against the scripted teacher, recorded by the proxy; then "
        f"{ws.steps} + {ws.noisy_steps} SFT steps on the recorded tokens (cached for later runs)"
    )
    key1 = cache_key(base, ws, harness, phase=1)
    exact = cache / f"warm-{harness.name}-exact-{key1}"
    demos = recorded(harness, base, words, play, cache / f"demos-{harness.name}-{key1}", say)
    data = DemoData(demos, PROBES, ws.seed)
    say(f"  {len(data.correct)} correct and {len(data.wrong)} imperfect demonstrations")
    current = base
    if (exact / "config.json").exists():
        say(f"  SFT phase 1: reusing {exact}")
        current = exact
    else:
        current = _phase(current, exact, data, ws, 1, say)
    data.correct_fraction = ws.correct_fraction
    return _phase(current, out, data, ws, 2, say)


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


def _phase(
    model_dir: Path,
    out: Path,
    data: DemoData,
    ws: WarmStartSection,
    phase: int,
    say: Callable[[str], None],
) -> Path:
    steps = ws.steps if phase == 1 else ws.noisy_steps

    def report(step: int, loss: float) -> None:
        if step % 50 == 0 or step == steps:
            say(f"  SFT phase {phase}: step {step}/{steps}, loss {loss:.3f}")

    def reproduces(model: Any) -> bool:
        rate = data.exact_rate(model)
        say(f"  SFT phase 1: greedy decoding reproduces {rate:.2f} of {len(data.probes)} probes")
        return rate >= EXACT_RATE

    cfg = SFTConfig(steps=steps, batch=ws.batch, lr=ws.lr, seed=ws.seed + phase - 1)
    return fine_tune(
        model_dir, out, data, cfg, on_step=report, done=reproduces if phase == 1 else None
    )
