"""Safe promotion: a new policy is served only if a held-out check says it does not regress.

When a weight sync is due, the trainer exports the candidate and asks its gate first
(:class:`PromotionGate`). :class:`HeldOutJudge`, the gate here, loads the candidate into vLLM
as a second LoRA adapter beside the served one (``policy-candidate``), has it and the served
policy answer a held-out prompt set (greedy, straight to vLLM: never recorded, never trained
on), and has a judge score each answer (:mod:`infra.judge`). The candidate is promoted if

    candidate score >= served score - max_regression

(``max_regression`` 0: no worse; 0.05: at most 0.05 worse on the 0-1 scale; negative: it must
improve by that much). Promoted, it is served as the next policy version (the usual swap,
:mod:`trainer.weight_sync`); held, the served version stays and the trainer keeps training from
its own weights, offering a candidate again at the next sync. Every check is one line of
``promotions.jsonl`` in the trainer's directory and ``promotion/*`` metrics of its step (the
audit's "Safe promotion" section). The served policy's score is measured once per served
version (a promoted candidate's own score is the next one's).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from infra.judge import Judge, JudgeConfig, answer
from schemas.errors import ConfigError
from trainer.weight_sync import SyncMode, WeightSync

CANDIDATE = "policy-candidate"  # the adapter name a candidate is loaded under in vLLM


@dataclass(frozen=True)
class Check:
    """One promotion check: the scores of the candidate and of the served policy."""

    candidate_score: float
    served_score: float
    max_regression: float

    @property
    def promoted(self) -> bool:
        return self.candidate_score >= self.served_score - self.max_regression

    def metrics(self) -> dict[str, float]:
        return {
            "promotion/checked": 1.0,
            "promotion/promoted": 1.0 if self.promoted else 0.0,
            "promotion/candidate_score": self.candidate_score,
            "promotion/served_score": self.served_score,
        }


class PromotionGate(Protocol):
    """Decides whether a candidate's weights may be served."""

    def check(self, candidate: Path, served_version: int, candidate_version: int) -> Check:
        """Check the exported ``candidate`` (to be served as ``candidate_version`` if promoted)
        against the policy served as ``served_version``."""
        ...


def load_prompts(path: Path) -> list[list[dict[str, Any]]]:
    """Held-out prompts from a JSONL file: per line ``{"messages": [...]}`` (Chat Completions
    messages) or ``{"prompt": "text"}`` (one user message)."""
    if not path.is_file():
        raise ConfigError(f"held-out prompts {path}: no such file (JSONL, one prompt per line)")
    out: list[list[dict[str, Any]]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            out.append([{"role": "user", "content": item["prompt"]}])
        elif isinstance(item, dict) and _is_messages(item.get("messages")):
            out.append(item["messages"])
        else:
            raise ConfigError(
                f'{path}:{n}: write {{"prompt": "..."}} or {{"messages": [{{"role": "user", '
                '"content": "..."}]}'
            )
    if not out:
        raise ConfigError(f"held-out prompts {path}: the file holds no prompt")
    return out


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )


@dataclass
class HeldOutJudge:
    """The gate of the module docstring. ``sync`` is the trainer's (its vLLM, LoRA mode);
    ``max_tokens``: each held-out answer's budget."""

    prompts: Sequence[list[dict[str, Any]]]
    judge: JudgeConfig
    sync: WeightSync
    max_regression: float = 0.0
    max_tokens: int = 64
    _served: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.sync.mode is not SyncMode.LORA:
            raise ConfigError(
                "the promotion gate loads the candidate beside the served policy, as a LoRA "
                "adapter: train a LoRA (--lora-rank > 0) with lora sync, or drop the gate"
            )
        if not math.isfinite(self.max_regression):
            raise ConfigError(f"max_regression must be a number, not {self.max_regression}")
        if not self.prompts:
            raise ConfigError("the promotion gate needs at least one held-out prompt")
        # The policies answer on the trainer's vLLM (the judge may be elsewhere).
        self._policies = replace(self.judge, url=self.sync.vllm_url, model=CANDIDATE)

    def check(self, candidate: Path, served_version: int, candidate_version: int) -> Check:
        self.sync.load(candidate, CANDIDATE)
        candidate_score = self.score(CANDIDATE)
        if served_version not in self._served:
            self._served = {served_version: self.score(self.sync.lora_name)}
        check = Check(candidate_score, self._served[served_version], self.max_regression)
        if check.promoted:  # the same weights, greedy: its score is the served one's next
            self._served = {candidate_version: candidate_score}
        return check

    def score(self, model: str) -> float:
        """The judge's mean score of ``model``'s answers to the held-out prompts."""
        judge = Judge(self.judge)
        scores = []
        for messages in self.prompts:
            reply = answer(self._policies, model, messages, self.max_tokens)
            lines = [f"{m['role']}: {m.get('content')}" for m in messages]
            scores.append(judge.score("\n".join([*lines, f"assistant: {reply}"])).score)
        return sum(scores) / len(scores)


class PromotionLog:
    """``promotions.jsonl``: one line per check (kept across restarts)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, step: int, candidate_version: int, served_version: int, check: Check) -> None:
        line = {
            "step": step,
            "at_us": time.time_ns() // 1000,
            "candidate_version": candidate_version,
            "served_version": served_version,
            "candidate_score": check.candidate_score,
            "served_score": check.served_score,
            "max_regression": check.max_regression,
            "promoted": check.promoted,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
