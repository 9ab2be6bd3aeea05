"""The ``[warm_start]`` section of the ``openforge train`` config: the supervised warm start's
recipe and settings (:mod:`openforge.train.warmstart`, :mod:`openforge.train.harness_warmstart`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from openforge.train.config_field import setting as _f
from schemas.errors import ConfigError


class WarmStartRecipe(StrEnum):
    NONE = "none"  # start RL from the base model as it is
    ECHO_WORDS = "echo-words"  # SFT on generated echo-words conversations (the demo's tasks)
    # SFT on the run's real harness's own recorded traffic with a scripted teacher
    HARNESS_TRAFFIC = "harness-traffic"


@dataclass
class WarmStartSection:
    recipe: WarmStartRecipe = _f(
        WarmStartRecipe.ECHO_WORDS,
        "supervised warm start: none, echo-words (the agent harness's prompt, generated), "
        "harness-traffic (the run's harness, recorded playing against a scripted teacher)",
    )
    steps: int = _f(1000, "SFT steps at most on the exact demonstrator (ends once it copies)")
    noisy_steps: int = _f(100, "then SFT steps on the noisy one (see correct_fraction)")
    correct_fraction: float = _f(0.25, "how often the noisy one writes to the instructed file")
    recovery_fraction: float = _f(
        0.0,
        "echo-words: the noisy phase also shows a first command that failed (a sandbox fault), "
        "after which the demonstrator runs it again this often, else answers Done. (0: never "
        "shows a failed command)",
    )
    lr: float = _f(3e-3, "SFT learning rate")
    exact_lr: float = _f(0.0, "harness-traffic: SFT learning rate on the whole sequences (0: lr)")
    noisy_lr: float = _f(
        0.0,
        "SFT learning rate of the noisy phase (0: lr); at lr the instructed file's probability "
        "swings by tenths from step to step, at 1e-4 it settles near correct_fraction",
    )
    batch: int = _f(16, "SFT examples per step")
    seed: int = _f(0, "seed of the SFT data and model")
    window: int = _f(
        48,
        "a sequence-length warmup first shows each sample from this many tokens before its "
        "first answer (0: none), then the whole sequence (both recipes)",
    )
    window_steps: int = _f(300, "SFT steps of that warmup")
    window_max_steps: int = _f(
        0,
        "harness-traffic: past window_steps the warmup goes on until greedy decoding reproduces "
        "90% of the probes' windows, at most this many steps in all (0: window_steps, no more)",
    )
    baseline: float = _f(
        0.0,
        "harness-traffic: the noisy phase stops once the instructed file's probability, where "
        "a correct and an imperfect demonstration part, is within [baseline/2, baseline] "
        "(0: all noisy_steps)",
    )

    def check(self) -> None:
        """Its ranges, and the settings only one recipe has."""
        counts = (self.steps, self.noisy_steps, self.window, self.window_steps)
        if min(*counts, self.window_max_steps, self.noisy_lr, self.exact_lr) < 0:
            raise ConfigError(
                "warm_start.steps, noisy_steps, window, window_steps, window_max_steps, "
                "exact_lr and noisy_lr must be >= 0"
            )
        for name in ("correct_fraction", "recovery_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"warm_start.{name} must be within [0, 1]")
        if self.recovery_fraction and self.recipe is not WarmStartRecipe.ECHO_WORDS:
            raise ConfigError(
                "warm_start.recovery_fraction is the echo-words recipe's: set "
                "warm_start.recipe = 'echo-words' or recovery_fraction = 0"
            )
        if not 0.0 <= self.baseline < 1.0:
            raise ConfigError("warm_start.baseline must be within [0, 1)")
