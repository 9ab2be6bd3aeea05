"""The judge stage: a Beam transform that scores each finished rollout with a rubric through a
model server, and posts the score as a reward named ``judge``.

    events | "Judge" >> JudgeRollouts(JudgeConfig(url, model), log_url)

Per rollout (keyed state), it keeps the completion frames until the rollout's lifecycle ends
(finished, failed or timed out: an infrastructure failure gets no score), then builds the
session's transcript (:mod:`pipeline.transcript`) and asks the judge (:mod:`infra.judge`). The
verdict is a :class:`~schemas.reward.RewardEvent` (``verifier = "judge"``, its event id
``judge-ROLLOUT``, the judge's answer as ``verifier_output``) appended to the events topic,
keyed by the rollout: the assembly joins it like any reward (:mod:`pipeline.rewards`: weight
it, require it). The judge's own calls go to the model server directly, never through the
proxy: they are not recorded as training data.

Restarts: a streaming job started again on the same log rereads it from the start. Each
verdict is also appended to the ``openforge.judgements`` topic after the events topic; a
rollout found there when the job starts is not judged again, so a restart neither pays for the
calls again nor posts a second score (which the assembly would count late). A job stopped
between the two appends judges that rollout once more (at least once).

Calls are made at the end of each bundle, ``concurrency`` at a time. A rollout the judge
cannot score (its server down through every try, an answer with no score, no recorded bodies)
gets no judge reward and is counted (``judge_failed``, ``judge_no_transcript``); the assembly's
deadline then dead-letters it or trains it without, per the reward policy.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder, BytesCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec

from infra.eventlog import EVENTS_TOPIC, EventLogWriter, open_writer, records_in
from infra.judge import Judge, JudgeConfig, JudgeError
from pipeline.arrival import DECODE_ERRORS, Arrival
from pipeline.assemble import NAMESPACE
from pipeline.transcript import transcript
from schemas.codec import decode_message, encode_message
from schemas.completion import CompletionEvent
from schemas.enums import TERMINAL_PHASES
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

log = logging.getLogger(__name__)

JUDGE = "judge"  # the reward's name (its verifier), as a reward policy weights or requires it
JUDGEMENTS_TOPIC = "openforge.judgements"  # the judge's verdicts again: what a restart skips


def judged_in(url: str) -> set[str]:
    """The rollouts the judge has scored on the log at ``url``."""
    return {r.rollout_id for r in records_in(url, JUDGEMENTS_TOPIC) if isinstance(r, RewardEvent)}


def _verdict_of(records: list[Any]) -> bool:
    return any(isinstance(r, RewardEvent) and r.verifier == JUDGE for r in records)


def _ended(records: list[Any]) -> RolloutEvent | None:
    for record in records:
        if isinstance(record, RolloutEvent) and record.phase in TERMINAL_PHASES:
            return record
    return None


class _JudgeFn(beam.DoFn):
    CALLS = BagStateSpec("calls", BytesCoder())  # the rollout's completion frames
    DONE = ReadModifyWriteStateSpec("done", BooleanCoder())  # ended, judged or skipped

    def __init__(self, cfg: JudgeConfig, log_url: str, concurrency: int) -> None:
        self.cfg, self.log_url, self.concurrency = cfg, log_url, concurrency
        self.counts = {
            name: Metrics.counter(NAMESPACE, f"judge_{name}")
            for name in ("scored", "failed", "no_transcript", "already")
        }

    def setup(self) -> None:
        self.judge = Judge(self.cfg)
        self.writer: EventLogWriter = open_writer(self.log_url)
        self.judged = judged_in(self.log_url)
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="judge")

    def start_bundle(self) -> None:
        self.pending: list[tuple[str, RolloutEvent, list[bytes]]] = []

    def process(
        self,
        element: tuple[str, bytes],
        calls: Any = beam.DoFn.StateParam(CALLS),
        done: Any = beam.DoFn.StateParam(DONE),
    ) -> None:
        """Keep a completion frame; at the rollout's end, queue it for the judge (its calls
        are made at the bundle's end). Nothing goes downstream: verdicts go to the log."""
        rollout_id, frame = element
        if done.read():
            return
        arrival = Arrival.of(frame)
        if arrival.kind is CompletionEvent:
            calls.add(frame)
            return
        end = _ended(arrival.records)
        if end is None and not _verdict_of(arrival.records):
            return
        done.write(True)
        frames = list(calls.read())
        calls.clear()
        if end is None or rollout_id in self.judged:  # scored by an earlier run of the job
            self.counts["already"].inc()
            return
        self.pending.append((rollout_id, end, frames))

    def finish_bundle(self) -> None:
        verdicts = []
        for verdict, outcome in self.pool.map(self._score, self.pending):
            self.counts[outcome].inc()  # here, not in the pool: Beam's counters are per thread
            if verdict is not None:
                verdicts.append(verdict)
        for verdict in verdicts:  # the events topic first: a verdict in the ledger is posted
            self.writer.append(EVENTS_TOPIC, verdict.rollout_id.encode(), encode_message([verdict]))
        self.writer.flush()
        for verdict in verdicts:
            self.writer.append(
                JUDGEMENTS_TOPIC, verdict.rollout_id.encode(), encode_message([verdict])
            )
            self.judged.add(verdict.rollout_id)
        self.writer.flush()
        self.pending = []

    def _score(self, item: tuple[str, RolloutEvent, list[bytes]]) -> tuple[RewardEvent | None, str]:
        """The judge's reward for one rollout (None if it gave none), and the outcome counted."""
        rollout_id, end, frames = item
        try:
            completions = [r for f in frames for r in decode_message(f)]
        except DECODE_ERRORS:
            completions = []
        text = transcript(r for r in completions if isinstance(r, CompletionEvent))
        if text is None:
            return None, "no_transcript"
        try:
            verdict = self.judge.score(text)
        except JudgeError as exc:
            log.warning("the judge gave rollout %s no score: %s", rollout_id, exc)
            return None, "failed"
        reward = RewardEvent(
            event_id=f"{JUDGE}-{rollout_id}",
            rollout_id=rollout_id,
            reward=verdict.score,
            at_us=time.time_ns() // 1000,
            task_id=end.task_id,
            verifier=JUDGE,
            verifier_output=f"{verdict.model}: {verdict.answer}",
        )
        return reward, "scored"

    def teardown(self) -> None:
        if getattr(self, "pool", None) is not None:
            self.pool.shutdown(wait=True)
        if getattr(self, "writer", None) is not None:
            self.writer.close()


class JudgeRollouts(beam.PTransform):
    """``(rollout_id, frame)`` -> judge rewards appended to the log at ``log_url`` (the one the
    frames come from). See the module docstring."""

    def __init__(self, cfg: JudgeConfig, log_url: str, concurrency: int = 4) -> None:
        super().__init__()
        self.cfg, self.log_url, self.concurrency = cfg, log_url, concurrency

    def expand(self, frames: Any) -> Any:
        return frames | "JudgeByRollout" >> beam.ParDo(
            _JudgeFn(self.cfg, self.log_url, self.concurrency)
        ).with_input_types(beam.typehints.Tuple[str, bytes])
