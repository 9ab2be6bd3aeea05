"""What became of simulated traffic, from the event log and the trainer's ledger: every call
answered is recorded once, every session ends as one episode or one dead letter, each episode is
trained at most once (the soak benchmark's and the services-apart test's counts).

A session's rollout is ``session-<id>`` (the simulator never resumes a session after the proxy
ended it). Records are read by offset (:func:`infra.eventlog.records_in`), so a message the log
holds twice is seen twice: ``duplicated`` counts them, and every other count is over distinct
ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, records_in
from openforge.query.lineage import consumed
from openforge.traffic.simulate import TrafficReport
from openforge.traffic.users import SessionResult
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus
from schemas.episode import Episode

# How pipeline.rollout_state words the dead letter of a reward that came too late.
LATE = "reward arrived after"


def rollout_of(result: SessionResult) -> str:
    return f"session-{result.plan.session}"


def trained_ids(trainer_out: Path) -> list[str]:
    """The episode ids of every update in the trainer's ``consumed.jsonl``, in step order."""
    steps = consumed(trainer_out / "consumed.jsonl")
    return [e for _, ids in sorted(steps.items()) for e in ids]


@dataclass(frozen=True)
class Ledger:
    served: int  # calls answered 200 to the users
    recorded: int  # of those, with an ok completion event in the log
    lost: int  # answered, no record
    duplicated: int  # completion messages the log holds more than once
    sessions: int
    rewarded: int  # sessions whose feedback was posted
    episodes: int  # sessions with an episode (rewards joined)
    dead_lettered: int  # sessions with a dead letter and no episode
    late_rewards: int  # rewards dead-lettered as late (after the episode or the deadline)
    trained: int  # distinct episodes trained on
    trained_twice: int  # episodes in more than one update
    versions_stamped: tuple[int, ...]  # policy versions on the calls' tokens

    def counts(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def ledger(url: str, report: TrafficReport, trainer_out: Path) -> Ledger:
    """The ledger of ``report``'s sessions in the log at ``url`` and the trainer at
    ``trainer_out``."""
    ours = {rollout_of(r): r for r in report.results}
    completions = [
        e
        for e in records_in(url, EVENTS_TOPIC)
        if isinstance(e, CompletionEvent) and e.rollout_id in ours
    ]
    unique = {e.event_id: e for e in completions}
    ok = Counter(e.rollout_id for e in unique.values() if e.status is CompletionStatus.OK)
    episodes = _of(url, EPISODES_TOPIC, ours)
    dead = _of(url, DEAD_LETTER_TOPIC, ours)
    trained = Counter(trained_ids(trainer_out))
    served = report.answered
    return Ledger(
        served=served,
        recorded=sum(min(ok[r], res.answered) for r, res in ours.items()),
        lost=sum(max(0, res.answered - ok[r]) for r, res in ours.items()),
        duplicated=len(completions) - len(unique),
        sessions=len(ours),
        rewarded=sum(r.feedback is not None for r in report.results),
        episodes=len({e.rollout_id for e in episodes}),
        dead_lettered=len({e.rollout_id for e in dead} - {e.rollout_id for e in episodes}),
        late_rewards=sum(LATE in (e.dead_letter or "") for e in dead),
        trained=len(trained),
        trained_twice=sum(n > 1 for n in trained.values()),
        versions_stamped=tuple(
            sorted({s.version for e in unique.values() for s in e.policy_versions})
        ),
    )


def _of(url: str, topic: str, ours: dict[str, SessionResult]) -> list[Episode]:
    return [e for e in records_in(url, topic) if isinstance(e, Episode) and e.rollout_id in ours]
