"""Assemble one rollout's events into an episode: a tree of token samples.

Calls whose prompt extends an existing sample's tokens exactly merge into that sample (loss mask 1
on generated tokens, 0 on prompt and tool tokens; behavior logprobs aligned; policy-version spans
kept). Where the prefix diverges (compaction, rewritten or injected history, a sub-agent thread) a
new sample starts, linked to the sample it shares the longest prefix with, and the fork records the
mismatch class. Duplicate events (same event id), failed attempts and attempts superseded by a
retry never contribute tokens; side calls (another model, a title request) are left out.

Pure Python and deterministic: the Beam transforms, replay and tests all call :func:`assemble`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pipeline.rewards import RewardPolicy, rule_values
from schemas.codec import Record
from schemas.completion import CompletionEvent, PolicySpan
from schemas.delta import Reconstructor, common_prefix
from schemas.enums import TERMINAL_PHASES, CompletionStatus, ContinuityClass
from schemas.episode import Episode, Fork, Sample, episode_id_for
from schemas.errors import SchemaError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent


@dataclass
class _Building:
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[PolicySpan] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    parent: int | None = None
    fork_class: ContinuityClass = ContinuityClass.FIRST

    def extend(self, prompt: list[int], event: CompletionEvent) -> None:
        new_prompt = prompt[len(self.tokens) :]
        self.tokens += new_prompt
        self.mask += [0] * len(new_prompt)
        self.logprobs += [0.0] * len(new_prompt)
        start = len(self.tokens)
        for span in event.policy_versions:
            self.spans.append(PolicySpan(span.version, start + span.start, start + span.end))
        self.tokens += event.completion_token_ids
        self.mask += [1] * len(event.completion_token_ids)
        self.logprobs += event.completion_logprobs
        self.events.append(event.event_id)
        self.images = list(event.image_ids)  # the prompt's images: the earlier ones and new


def reward_order(reward: RewardEvent) -> tuple[int, int, str]:
    """Rewards of a rollout in the order the join reads them, the one it uses last: by verifier
    version (the score recorded when the rollout ran has none, counted as 0; a re-score by
    ``openforge replay rescore`` has N >= 1), then by time. So a re-score wins over the original
    score, and over an older re-score, in whatever order the events arrive."""
    return (reward.verifier_version or 0, reward.at_us, reward.event_id)


@dataclass(frozen=True)
class RolloutEvents:
    """A rollout's events, deduplicated by event id and split by type."""

    completions: list[CompletionEvent]
    rewards: list[RewardEvent]
    lifecycle: list[RolloutEvent]

    @classmethod
    def of(cls, records: Iterable[Record]) -> RolloutEvents:
        seen: set[str] = set()
        completions, rewards, lifecycle = [], [], []
        for record in records:
            key = getattr(record, "event_id", None)
            if key is None or key in seen:
                continue
            seen.add(key)
            if isinstance(record, CompletionEvent):
                completions.append(record)
            elif isinstance(record, RewardEvent):
                rewards.append(record)
            elif isinstance(record, RolloutEvent):
                lifecycle.append(record)
        completions.sort(key=lambda e: (e.call_index, e.timings.received_us, e.event_id))
        rewards.sort(key=reward_order)
        lifecycle.sort(key=lambda r: (r.at_us, r.event_id))
        return cls(completions, rewards, lifecycle)

    @property
    def finished(self) -> bool:
        return any(r.phase in TERMINAL_PHASES for r in self.lifecycle)

    @property
    def reward(self) -> RewardEvent | None:
        """The reward of the newest verifier version, the latest of those (a verifier's score
        may be revised, e.g. by user feedback): see :func:`reward_order`."""
        return self.rewards[-1] if self.rewards else None

    def all_ids(self) -> list[str]:
        return [
            *(e.event_id for e in self.lifecycle),
            *(e.event_id for e in self.completions),
            *(r.event_id for r in self.rewards),
        ]


def contributing(completions: list[CompletionEvent]) -> list[CompletionEvent]:
    """Calls whose tokens belong in the episode: ok, not a side call, not superseded by a retry."""
    superseded = {e.retry_of for e in completions if e.retry_of is not None}
    return [
        e
        for e in completions
        if e.status is CompletionStatus.OK
        and not e.side_call
        and e.event_id not in superseded
        and e.completion_token_ids
    ]


def assemble(
    rollout_id: str,
    records: Iterable[Record],
    created_us: int,
    dead_letter: str | None = None,
    policy: RewardPolicy = RewardPolicy(),  # frozen: one shared default is safe
) -> Episode:
    """The episode of one rollout from all its events (any order, duplicates allowed); its
    reward as ``policy`` makes it of the rollout's reward events (:mod:`pipeline.rewards`)."""
    events = RolloutEvents.of(records)
    samples, forks = _build_samples(events.completions)
    value, components = policy.reward(
        events.rewards, rule_values(events.completions, events.lifecycle)
    )
    task_id, group_id, harness = _identity(events)
    return Episode(
        episode_id=episode_id_for(rollout_id),
        rollout_id=rollout_id,
        samples=[
            Sample(
                i,
                s.tokens,
                s.mask,
                s.logprobs,
                s.spans,
                s.parent,
                s.fork_class,
                s.events,
                s.images,
            )
            for i, s in enumerate(samples)
        ],
        reward=value,
        created_us=created_us,
        task_id=task_id,
        group_id=group_id,
        harness=harness,
        reward_components=components,
        forks=forks,
        lineage=events.all_ids(),
        dead_letter=dead_letter,
    )


def _build_samples(completions: list[CompletionEvent]) -> tuple[list[_Building], list[Fork]]:
    """The samples of a rollout's calls: each contributing call extends the sample whose tokens
    its prompt continues (the longest), or starts a new one forked where it shares the longest
    prefix with an earlier one, classed by its stated continuity."""
    rebuild = Reconstructor()
    prompts: dict[str, list[int]] = {}
    for event in completions:  # every event, in call order: deltas refer backwards
        prompts[event.event_id] = rebuild.prompt(event)
    samples: list[_Building] = []
    forks: list[Fork] = []
    for event in contributing(completions):
        prompt = prompts[event.event_id]
        target = _continued(samples, prompt, event.image_ids)
        if target is None:
            fork = _fork(samples, prompt, event)
            samples.append(_Building(parent=fork.parent_index, fork_class=fork.mismatch))
            target = len(samples) - 1
            forks.append(fork)
        samples[target].extend(prompt, event)
    return samples, forks


def _continued(samples: list[_Building], prompt: list[int], images: list[str]) -> int | None:
    """The sample whose whole token list ``prompt`` starts with (the longest), if any, and
    whose images the call's start with too (an image's placeholder tokens are the same for any
    image: another screenshot in their place is another prompt)."""
    target, best = None, -1
    for i, sample in enumerate(samples):
        n = len(sample.tokens)
        if (
            n > best
            and prompt[:n] == sample.tokens
            and images[: len(sample.images)] == sample.images
        ):
            target, best = i, n
    return target


def _fork(samples: list[_Building], prompt: list[int], event: CompletionEvent) -> Fork:
    """Where a new sample starts: forked off the sample sharing the longest prefix (ties: the
    latest), classed by the call's continuity, or rewritten/unrelated where that says nothing."""
    parent, shared = None, 0
    for i, sample in enumerate(samples):
        k = common_prefix(prompt, sample.tokens)
        if k and k >= shared:
            parent, shared = i, k
    mismatch = event.continuity
    if parent is not None and mismatch in (ContinuityClass.FIRST, ContinuityClass.EXACT):
        mismatch = ContinuityClass.REWRITTEN  # the prefix diverged without a stated cause
    if parent is None and samples and mismatch is ContinuityClass.FIRST:
        mismatch = ContinuityClass.UNRELATED
    return Fork(len(samples), parent, event.call_index, mismatch, shared)


def _identity(events: RolloutEvents) -> tuple[str | None, str | None, str | None]:
    """The rollout's task, group and harness: from its lifecycle, else its calls, else (task
    only) its reward."""
    first = events.lifecycle[0] if events.lifecycle else None
    some = events.completions[0] if events.completions else None
    reward = events.reward
    task_id = (
        (first.task_id if first else None)
        or (some.task_id if some else None)
        or (reward.task_id if reward else None)
    )
    harness = (first.harness if first else None) or (some.harness if some else None)
    return task_id, first.group_id if first else None, harness


def missing_events(records: Iterable[Record]) -> list[str]:
    """What ``records`` say is still to come (a split read can deliver part of a rollout's log
    late): the ids of earlier calls its completions extend (delta form), and ``call N`` for each
    call the proxy numbered (its terminal event says how many) whose completion event is not
    here. The episode is built once this is empty."""
    records = list(records)
    completions = [r for r in records if isinstance(r, CompletionEvent)]
    present = {e.event_id for e in completions}
    refs = {
        ref
        for e in completions
        for ref in (e.prompt_ref_event_id, e.request_history_ref)
        if ref is not None
    }
    numbered = max(
        (r.calls for r in records if isinstance(r, RolloutEvent) and r.calls is not None),
        default=0,
    )
    indices = set(range(numbered)) - {e.call_index for e in completions}
    return sorted(refs - present) + [f"call {i}" for i in sorted(indices)]


def assemble_dead_letter(
    rollout_id: str,
    records: list[Record],
    created_us: int,
    reason: str,
    policy: RewardPolicy = RewardPolicy(),
) -> Episode:
    """A dead-letter episode that never fails: where the calls cannot be rebuilt (a missing or
    damaged event), it keeps the rollout's other records and says why, with every event id of
    the rollout in its lineage."""
    try:
        return assemble(rollout_id, records, created_us, dead_letter=reason, policy=policy)
    except SchemaError as exc:
        rest = [r for r in records if not isinstance(r, CompletionEvent)]
        episode = assemble(
            rollout_id,
            rest,
            created_us,
            dead_letter=f"{reason}; its calls cannot be rebuilt: {exc}",
            policy=policy,
        )
        return replace(episode, lineage=RolloutEvents.of(records).all_ids())
