"""Read a verifier's output directory (``/logs/verifier`` in the sandbox) into a reward.

The rule, Harbor's convention made exact:

1. ``reward.json``, if it exists, wins over ``reward.txt`` (even when it is broken: a broken
   reward.json is an error, never a silent fall-back). It must be a JSON object of finite numbers
   (booleans are not numbers), the named components. The reward is its ``reward`` key; without
   one, a single component is the reward, and several are an error (averaging ``tests_passed``
   with a score would be meaningless: write a ``reward`` key).
2. Otherwise ``reward.txt``: one finite number (surrounding white space ignored); its component
   is ``{"reward": value}``.
3. Neither file, an unreadable one, or a non-finite value: an error.

An error is not raised: :func:`read_reward` returns a :class:`VerifierReward` with ``reward``
None and ``error`` saying what was wrong, so that one bad verifier is recorded, not fatal to a
batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

REWARD_JSON = "reward.json"
REWARD_TXT = "reward.txt"


@dataclass(frozen=True)
class VerifierReward:
    """What a verifier's output says: the reward and its components, or why there is none."""

    reward: float | None
    components: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    source: Path | None = None  # the file it was read from
    error: str | None = None  # set exactly when reward is None

    @property
    def ok(self) -> bool:
        return self.error is None


def _is_number(value: object) -> bool:
    """A finite JSON number (not a boolean, not an integer past float range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _failed(error: str, source: Path | None = None) -> VerifierReward:
    return VerifierReward(None, source=source, error=error)


def _from_json(path: Path, text: str | None = None) -> VerifierReward:
    try:
        value = json.loads(path.read_text(encoding="utf-8") if text is None else text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return _failed(f"{path}: not readable as JSON ({exc})", path)
    if not isinstance(value, dict) or not value:
        return _failed(f"{path}: must be a non-empty JSON object of numbers, got {value!r}", path)
    bad = {k: v for k, v in value.items() if not _is_number(v)}
    if bad:
        return _failed(f"{path}: components must be finite numbers; not: {bad!r}", path)
    components = MappingProxyType({k: float(v) for k, v in value.items()})
    if "reward" in components:
        reward = components["reward"]
    elif len(components) == 1:
        (reward,) = components.values()
    else:
        return _failed(
            f"{path}: {len(components)} components and no 'reward' key; the verifier must say "
            "which is the reward",
            path,
        )
    return VerifierReward(reward, components, path)


def _from_txt(path: Path, content: str | None = None) -> VerifierReward:
    try:
        text = (path.read_text(encoding="utf-8") if content is None else content).strip()
    except (OSError, UnicodeDecodeError) as exc:
        return _failed(f"{path}: not readable ({exc})", path)
    try:
        reward = float(text)
    except ValueError:
        return _failed(f"{path}: must hold one number, got {text[:80]!r}", path)
    if not math.isfinite(reward):
        return _failed(f"{path}: the reward must be finite, got {text!r}", path)
    return VerifierReward(reward, MappingProxyType({"reward": reward}), path)


def read_reward(verifier_dir: Path) -> VerifierReward:
    """The reward in ``verifier_dir`` by the module's rule; never raises for a bad output."""
    if (verifier_dir / REWARD_JSON).exists():
        return _from_json(verifier_dir / REWARD_JSON)
    if (verifier_dir / REWARD_TXT).exists():
        return _from_txt(verifier_dir / REWARD_TXT)
    return _failed(f"{verifier_dir}: the verifier wrote neither {REWARD_JSON} nor {REWARD_TXT}")


def parse_reward(file: str, text: str, source: Path) -> VerifierReward:
    """The reward in the text of a verifier's ``file`` (``reward.json`` or ``reward.txt``), read
    elsewhere (e.g. from a pod's termination log), by the module's rule; never raises."""
    if file == REWARD_JSON:
        return _from_json(source, text)
    if file == REWARD_TXT:
        return _from_txt(source, text)
    return _failed(f"{source}: not a reward file ({REWARD_JSON} or {REWARD_TXT})", source)
