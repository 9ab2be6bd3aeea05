"""Random multi-turn rollouts with a known episode, split into the events a proxy records."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from schemas.codec import Record
from schemas.completion import CompletionEvent, PolicySpan, Timings
from schemas.delta import DeltaEncoder, common_prefix
from schemas.enums import CompletionStatus, ContinuityClass, Dialect, RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

T0 = 1_796_000_000_000_000


@dataclass
class TrueSample:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    parent: int | None = None


@dataclass
class Rollout:
    rollout_id: str
    records: list[Record]
    samples: list[TrueSample]
    reward: float


class _Builder:
    """One rollout's records and true samples, grown call by call from one random stream."""

    def __init__(self, seed: int, rollout_id: str) -> None:
        self.rng = random.Random(seed)
        self.fresh = itertools.count(10_000 + seed * 100_000)  # never seen before: forks diverge
        self.encoder = DeltaEncoder()
        self.rollout_id = rollout_id
        self.index = itertools.count()
        self.current = -1  # the sample the next extension grows
        self.samples: list[TrueSample] = []
        self.records: list[Record] = [
            RolloutEvent(
                f"{rollout_id}-start",
                rollout_id,
                RolloutPhase.STARTED,
                T0,
                task_id="task",
                group_id="g",
                harness="h",
            )
        ]

    def event(
        self, prompt: list[int], completion: list[int], thread: int, **kw: object
    ) -> CompletionEvent:
        """The completion event of one call on ``thread``, its prompt delta-encoded."""
        i = next(self.index)
        eid = f"{self.rollout_id}-c{i}"
        pdelta, _ = self.encoder.encode(f"t{thread}", eid, Dialect.CHAT, prompt, completion, None)
        return CompletionEvent(
            event_id=eid,
            rollout_id=self.rollout_id,
            call_index=i,
            dialect=Dialect.CHAT,
            streamed=True,
            model="m",
            timings=Timings(T0 + 1000 * (i + 1)),
            prompt_ref_event_id=pdelta.ref_event_id,
            prompt_ref_tokens=pdelta.ref_tokens,
            prompt_token_ids=pdelta.suffix,
            prompt_length=len(prompt),
            completion_token_ids=completion,
            completion_logprobs=[-self.rng.randrange(1, 64) / 8 for _ in completion],
            policy_versions=[PolicySpan(3, 0, len(completion))],
            thread_id=f"t{thread}",
            **kw,  # type: ignore[arg-type]
        )

    def call(self) -> None:
        """One turn: its prompt, its answer (maybe after a failed attempt), and sometimes a
        side call and a duplicated delivery."""
        rng = self.rng
        new = [next(self.fresh) for _ in range(rng.randint(1, 6))]
        completion = [rng.randrange(500) for _ in range(rng.randint(1, 8))]
        if self.current < 0 or rng.random() < 0.2:  # a new sample: first thread or a fork
            prompt, cls = self._fork(new)
        else:
            prompt, cls = self.samples[self.current].tokens + new, ContinuityClass.EXACT
        answer = self._answer(prompt, completion, cls)
        self.records.append(answer)
        self._grow(prompt, answer)
        if rng.random() < 0.15:  # a side call: another model, its own thread, never trained on
            self.records.append(self.event([next(self.fresh)], [1, 2], 99, side_call=True))
        if rng.random() < 0.2:
            self.records.append(answer)  # a duplicate delivery

    def _fork(self, new: list[int]) -> tuple[list[int], ContinuityClass]:
        """A new sample: the first thread, or one diverging strictly inside an earlier one."""
        rng, samples = self.rng, self.samples
        parent = rng.randrange(len(samples)) if samples else None
        # Cut strictly inside the parent: a cut at its end would be an extension, not a fork.
        base = (
            samples[parent].tokens[: rng.randint(0, len(samples[parent].tokens) - 1)]
            if parent is not None
            else []
        )
        # The parent is the sample sharing the longest prefix (ties: the latest one).
        prompt = base + new
        shared = [common_prefix(prompt, t.tokens) for t in samples]
        best = max(shared, default=0)
        parent = max(i for i, k in enumerate(shared) if k == best) if best else None
        samples.append(TrueSample(parent=parent))
        self.current = len(samples) - 1
        if not base:
            return prompt, ContinuityClass.FIRST
        kinds = [ContinuityClass.COMPACTED, ContinuityClass.REWRITTEN, ContinuityClass.DROPPED]
        return prompt, rng.choice(kinds)

    def _answer(
        self, prompt: list[int], completion: list[int], cls: ContinuityClass
    ) -> CompletionEvent:
        """The call's answer; sometimes after a failed attempt, answered by the retry."""
        if self.rng.random() >= 0.2:
            return self.event(prompt, completion, self.current, continuity=cls)
        partial = completion[: self.rng.randint(0, len(completion))]
        failed = self.event(
            prompt,
            partial,
            self.current,
            status=CompletionStatus.CLIENT_DISCONNECTED,
            continuity=cls,
        )
        self.records.append(failed)
        return self.event(
            prompt,
            completion,
            self.current,
            retry_of=failed.event_id,
            continuity=ContinuityClass.RETRY,
        )

    def _grow(self, prompt: list[int], answer: CompletionEvent) -> None:
        """The current sample extended by the prompt's new tokens and the answer."""
        sample = self.samples[self.current]
        added = prompt[len(sample.tokens) :]
        sample.tokens += added
        sample.mask += [0] * len(added)
        sample.logprobs += [0.0] * len(added)
        sample.tokens += answer.completion_token_ids
        sample.mask += [1] * len(answer.completion_token_ids)
        sample.logprobs += answer.completion_logprobs

    def end(self, with_reward: bool, finished: bool) -> float:
        """The rollout's reward (drawn always, recorded if ``with_reward``) and its finish."""
        rollout_id, records = self.rollout_id, self.records
        reward = self.rng.randrange(0, 100) / 100
        if with_reward:
            records.append(
                RewardEvent(
                    f"{rollout_id}-reward",
                    rollout_id,
                    reward,
                    T0 + 10**6,
                    components={"tests": reward},
                )
            )
        if finished:
            numbered = {r.call_index for r in records if isinstance(r, CompletionEvent)}
            records.append(
                RolloutEvent(
                    f"{rollout_id}-end",
                    rollout_id,
                    RolloutPhase.FINISHED,
                    T0 + 2 * 10**6,
                    exit_code=0,
                    calls=len(numbered),
                )
            )
        return reward


def make_rollout(
    seed: int,
    rollout_id: str = "r",
    calls: int = 8,
    with_reward: bool = True,
    finished: bool = True,
) -> Rollout:
    """A rollout of ``calls`` turns: mostly extensions of the current thread, sometimes a fork
    (a new thread diverging from an earlier point), a failed attempt and its retry, a side call,
    and duplicated events."""
    builder = _Builder(seed, rollout_id)
    for _ in range(calls):
        builder.call()
    reward = builder.end(with_reward, finished)
    return Rollout(rollout_id, builder.records, builder.samples, reward)
