"""A run's utilisation and critical path, from the ``timeline`` and ``step_costs`` queries: the
rollouts laid out in sandbox slots, how busy the slots, the trainer and the engine were over
the run's wall time, and which of them bounded it (the busiest)."""

from __future__ import annotations

from collections.abc import Sequence

from openforge.audit.queries import Query, Result

Span = tuple[float, float, str, str]  # start s, end s, kind, label

UTILISATION = Query(
    "utilisation",
    "Busy fractions and the stage that bounded the run",
    "one row per stage: the fraction of the run's wall time it was busy (sandbox slots: the "
    "rollouts' time over slots x wall time, the slots being the most rollouts at once; "
    "trainer: updates and weight syncs; engine: requests running, sampled from vLLM's "
    "metrics), and whether it bounded the run (the busiest)",
    "-- computed in openforge/audit/utilisation.py from the timeline and step_costs queries",
)


def slots(spans: Sequence[Span]) -> list[list[Span]]:
    """Rollouts (and evaluations) in slots: each in the first slot free at its start."""
    lanes: list[list[Span]] = []
    for span in sorted(spans):
        for lane in lanes:
            if lane[-1][1] <= span[0]:
                lane.append(span)
                break
        else:
            lanes.append([span])
    return lanes


def lanes(timeline: Result) -> list[tuple[str, list[Span]]]:
    """The timeline's rows as chart lanes: one per sandbox slot, then the trainer's."""
    spans: list[Span] = [
        (float(start), float(end), str(kind), str(label))
        for kind, label, start, end in timeline.rows
    ]
    rollouts = [s for s in spans if s[2] in ("rollout", "evaluation")]
    trainer = [s for s in spans if s[2] in ("update", "sync")]
    out = [(f"slot {i + 1}", lane) for i, lane in enumerate(slots(rollouts))]
    return out + ([("trainer", sorted(trainer))] if trainer else [])


def utilisation(timeline: Result, steps: Result) -> Result:
    """The busy fraction of each stage over the run's wall time; the busiest bounded it."""
    by_lane = lanes(timeline)
    spans = [s for _, lane in by_lane for s in lane]
    wall = max((end for _, end, _, _ in spans), default=0.0)
    if wall <= 0:
        return Result(UTILISATION, ["stage", "busy_fraction", "bounded_the_run"], [])
    rollout_lanes = [lane for name, lane in by_lane if name.startswith("slot")]
    stages: list[tuple[str, float | None]] = []
    if rollout_lanes:
        busy = sum(end - start for lane in rollout_lanes for start, end, _, _ in lane)
        stages.append((f"sandbox slots ({len(rollout_lanes)})", busy / (len(rollout_lanes) * wall)))
    trainer = [s for name, lane in by_lane if name == "trainer" for s in lane]
    if trainer:
        stages.append(("trainer", sum(end - start for start, end, _, _ in trainer) / wall))
    stages.append(("engine", _engine_busy(steps)))
    known = [(name, value) for name, value in stages if value is not None]
    top = max(known, key=lambda kv: kv[1])[0] if known else None
    rows = [(name, value, name == top) for name, value in stages]
    return Result(UTILISATION, ["stage", "busy_fraction", "bounded_the_run"], rows)


def _engine_busy(steps: Result) -> float | None:
    """The engine's busy fraction over the steps it was sampled in, weighted by their length."""
    pairs = [
        (float(b), float(w) if w is not None else 1.0)
        for b, w in zip(steps.column("engine_busy"), steps.column("since_previous_s"), strict=True)
        if b is not None
    ]
    total = sum(w for _, w in pairs)
    return sum(b * w for b, w in pairs) / total if total else None


def bounded_by(result: Result) -> str:
    """A sentence naming the stage that bounded the run, and how busy it was."""
    for stage, busy, top in result.rows:
        if top:
            return f"bounded by the {stage}: busy {busy:.0%} of the run's wall time"
    return "not enough records to say what bounded the run"
