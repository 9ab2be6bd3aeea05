"""How a rollout's rewards, from several sources and times, become its training reward.

A rollout may get several :class:`~schemas.reward.RewardEvent`\\ s: the task's verifier, a
person's feedback posted later, a CI result, a re-score. Each brings named values: its
``components``, and its scalar ``reward`` under the name of its source (``verifier``, or
``reward`` when it names none). A name's value is the one from the newest event that carries
it (:func:`pipeline.assembly.reward_order`: a re-score wins, then the latest). Rules over the
rollout's own records give values too, named ``rule:...`` (:func:`rule_values`):
``rule:exit_ok`` (1 if the agent ended ``finished``, 0 if it failed or timed out) and
``rule:call_errors`` (the share of its calls that did not end ``ok``).

A :class:`RewardPolicy` says what the training reward is:

- no ``weights`` (the default): the newest event's scalar ``reward``, as before;
- ``weights``: the weighted sum of the named values present (a name with no value adds
  nothing; the episode's ``reward_components`` hold every value from reward events, and the
  rule values the policy names).

and when a rollout has its reward: with no ``required`` names, on its first reward event; else
once every required name has a value (``rule:`` names are computed when the episode is built,
so they never hold it back). At its deadline, a rollout still missing a required name is
dead-lettered (``on_missing = dead_letter``, the default) or trained with the values it has
(``train``, if it has any). A reward arriving after the episode was emitted is counted and
dead-lettered by the assembly (never applied twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus, RolloutPhase
from schemas.errors import ConfigError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

RULE = "rule:"  # the prefix of values computed from the rollout's own records


class MissingRewards(StrEnum):
    """What the deadline does with a rollout missing a required reward."""

    DEAD_LETTER = "dead_letter"
    TRAIN = "train"  # with the values it has

    @classmethod
    def of(cls, value: str) -> MissingRewards:
        try:
            return cls(value.replace("-", "_"))
        except ValueError:
            raise ConfigError(
                f"on_missing must be one of {[m.value for m in cls]}, not {value!r}"
            ) from None


def rule_values(
    completions: Sequence[CompletionEvent], lifecycle: Sequence[RolloutEvent]
) -> dict[str, float]:
    """The rule values of a rollout's records (see the module docstring)."""
    out: dict[str, float] = {}
    for event in lifecycle:
        if event.phase is RolloutPhase.FINISHED:
            out[f"{RULE}exit_ok"] = 1.0
        elif event.phase in (RolloutPhase.FAILED, RolloutPhase.TIMED_OUT):
            out[f"{RULE}exit_ok"] = 0.0
    calls = [e for e in completions if not e.side_call]
    if calls:
        failed = sum(e.status is not CompletionStatus.OK for e in calls)
        out[f"{RULE}call_errors"] = failed / len(calls)
    return out


def named_values(reward: RewardEvent) -> dict[str, float]:
    """The named values one reward event brings (see the module docstring)."""
    return {**reward.components, (reward.verifier or "reward"): reward.reward}


@dataclass(frozen=True)
class RewardPolicy:
    """See the module docstring. Checked when built (a ConfigError says what is wrong)."""

    weights: Mapping[str, float] = field(default_factory=dict)
    required: Sequence[str] = ()
    on_missing: MissingRewards = MissingRewards.DEAD_LETTER

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_missing", MissingRewards.of(str(self.on_missing)))
        for name, weight in self.weights.items():
            if not isinstance(weight, int | float) or weight != weight:
                raise ConfigError(f"reward weight {name!r} must be a number, not {weight!r}")
        object.__setattr__(self, "weights", {str(k): float(v) for k, v in self.weights.items()})
        object.__setattr__(self, "required", tuple(str(n) for n in self.required))

    @classmethod
    def of_options(
        cls, weights: Sequence[str], required: Sequence[str], on_missing: str
    ) -> RewardPolicy:
        """From command-line options: ``weights`` as ``NAME=WEIGHT`` each."""
        parsed: dict[str, float] = {}
        for item in weights:
            name, eq, value = item.partition("=")
            try:
                parsed[name.strip()] = float(value) if eq and name.strip() else float("nan")
            except ValueError:
                parsed[name.strip()] = float("nan")
            if parsed[name.strip()] != parsed[name.strip()]:
                raise ConfigError(f"--reward-weight {item!r}: write NAME=WEIGHT, e.g. tests=1.0")
        return cls(parsed, tuple(required), MissingRewards.of(on_missing))

    def complete(self, names: Iterable[str], any_reward: bool) -> bool:
        """Whether a rollout with rewards bringing ``names`` has its reward."""
        needed = [n for n in self.required if not n.startswith(RULE)]
        if not needed:
            return any_reward
        have = set(names)
        return all(n in have for n in needed)

    def values(self, rewards: Sequence[RewardEvent]) -> dict[str, float]:
        """Each name's value, from the newest event carrying it (``rewards`` in
        :func:`~pipeline.assembly.reward_order`)."""
        out: dict[str, float] = {}
        for reward in rewards:
            out.update(named_values(reward))
        return out

    def reward(
        self, rewards: Sequence[RewardEvent], rules: Mapping[str, float] | None = None
    ) -> tuple[float | None, dict[str, float]]:
        """The training reward and the components the episode records (``rewards`` in
        :func:`~pipeline.assembly.reward_order`; ``rules``: :func:`rule_values`); None without
        any reward event."""
        if not rewards:
            return None, {}
        if not self.weights:
            return rewards[-1].reward, dict(rewards[-1].components)
        wanted = {**self.weights, **dict.fromkeys(self.required, 0.0)}
        values = {**{n: v for n, v in (rules or {}).items() if n in wanted}, **self.values(rewards)}
        total = sum(w * values[n] for n, w in self.weights.items() if n in values)
        return total, values
