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
    rng = random.Random(seed)
    fresh = itertools.count(10_000 + seed * 100_000)  # ids never seen before: forks diverge
    encoder = DeltaEncoder()
    samples: list[TrueSample] = []
    records: list[Record] = [
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
    index = itertools.count()
    current = -1

    def event(
        prompt: list[int], completion: list[int], thread: int, **kw: object
    ) -> CompletionEvent:
        i = next(index)
        eid = f"{rollout_id}-c{i}"
        pdelta, _ = encoder.encode(f"t{thread}", eid, Dialect.CHAT, prompt, completion, None)
        return CompletionEvent(
            event_id=eid,
            rollout_id=rollout_id,
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
            completion_logprobs=[-rng.randrange(1, 64) / 8 for _ in completion],
            policy_versions=[PolicySpan(3, 0, len(completion))],
            thread_id=f"t{thread}",
            **kw,  # type: ignore[arg-type]
        )

    for _ in range(calls):
        new = [next(fresh) for _ in range(rng.randint(1, 6))]
        completion = [rng.randrange(500) for _ in range(rng.randint(1, 8))]
        if current < 0 or rng.random() < 0.2:  # a new sample: first thread or a fork
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
            current = len(samples) - 1
            prompt = base + new
            cls = (
                ContinuityClass.FIRST
                if not base
                else rng.choice(
                    [ContinuityClass.COMPACTED, ContinuityClass.REWRITTEN, ContinuityClass.DROPPED]
                )
            )
        else:
            prompt = samples[current].tokens + new
            cls = ContinuityClass.EXACT
        if rng.random() < 0.2:  # a failed attempt, then the harness's retry of the same turn
            partial = completion[: rng.randint(0, len(completion))]
            failed = event(
                prompt,
                partial,
                current,
                status=CompletionStatus.CLIENT_DISCONNECTED,
                continuity=cls,
            )
            records.append(failed)
            ev = event(
                prompt,
                completion,
                current,
                retry_of=failed.event_id,
                continuity=ContinuityClass.RETRY,
            )
        else:
            ev = event(prompt, completion, current, continuity=cls)
        records.append(ev)
        sample = samples[current]
        if not sample.tokens:
            sample.tokens, sample.mask, sample.logprobs = (
                list(prompt),
                [0] * len(prompt),
                [0.0] * len(prompt),
            )
        else:
            added = prompt[len(sample.tokens) :]
            sample.tokens += added
            sample.mask += [0] * len(added)
            sample.logprobs += [0.0] * len(added)
        sample.tokens += completion
        sample.mask += [1] * len(completion)
        sample.logprobs += ev.completion_logprobs
        if rng.random() < 0.15:  # a side call: another model, its own thread, never trained on
            records.append(event([next(fresh)], [1, 2], 99, side_call=True))
        if rng.random() < 0.2:
            records.append(ev)  # a duplicate delivery
    reward = rng.randrange(0, 100) / 100
    if with_reward:
        records.append(
            RewardEvent(
                f"{rollout_id}-reward", rollout_id, reward, T0 + 10**6, components={"tests": reward}
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
    return Rollout(rollout_id, records, samples, reward)
