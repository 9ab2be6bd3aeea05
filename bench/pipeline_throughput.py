"""Episode assembly on Beam's portable runner Prism and on the in-process FnApiRunner, side by
side: events per second, and reward-to-episode latency.

    .venv/bin/python -m bench.pipeline_throughput [--rollouts 400] [--calls 10]

1. Throughput: ROLLOUTS rollouts of CALLS completion events (with forks, retries, duplicates,
   side calls; see openforge/testing/rollouts.py) plus their rewards and ends are written to an
   embedded local log; the streaming pipeline (``--streaming``) reads, assembles and writes every
   episode, once per runner. Each row names the runner the job's own report gives (and the
   records its source counted), so a row cannot come from another code path. Baseline, side by
   side: the same frames read and assembled in a plain Python loop (no Beam), which bounds what
   the runner adds.
2. Latency, per runner: while the pipeline runs, a producer writes rollouts live (a call every
   5 ms); for each episode, the time from its reward's write to the episode's emission.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from infra.eventlog import EPISODES_TOPIC, EVENTS_TOPIC, open_reader, open_writer
from openforge.testing.rollouts import make_rollout
from pipeline.assembly import assemble
from pipeline.jobs import Outputs, RunReport, run_streaming
from schemas.codec import decode_message, encode_message
from schemas.completion import CompletionEvent
from schemas.episode import Episode
from schemas.reward import RewardEvent


def _write(url: str, rollouts: list, pace_s: float = 0.0) -> dict[str, int]:  # type: ignore[type-arg]
    """Write rollouts' events; returns each reward's write time (us) by rollout id."""
    reward_at: dict[str, int] = {}
    with open_writer(url) as writer:
        for r in rollouts:
            for rec in r.records:
                writer.append(EVENTS_TOPIC, r.rollout_id.encode(), encode_message([rec]))
                if isinstance(rec, RewardEvent):
                    writer.flush()
                    reward_at[r.rollout_id] = time.time_ns() // 1000
                if pace_s and isinstance(rec, CompletionEvent):
                    writer.flush()
                    time.sleep(pace_s)
    return reward_at


def _episodes(url: str) -> list[Episode]:
    with open_reader(url, [EPISODES_TOPIC], "bench") as reader:
        out: list[Episode] = []
        while recs := reader.poll(5000, 0.5):
            out += [e for rec in recs for e in decode_message(rec.value)]  # type: ignore[misc]
    return out


RUNNERS = {"Prism": [], "FnApiRunner": ["--runner=FnApiRunner"]}  # label -> Beam args


def _throughput(url: str, beam_args: list[str], n_rollouts: int, idle: float) -> RunReport:
    """The streaming job over the recorded log, into a fresh episodes log; stops ``idle`` s
    after the log goes idle."""
    report = run_streaming(
        url, Outputs(url), beam_args, allowed_lateness_s=30, stop_when_idle_s=idle
    )
    episodes = _episodes(url)
    assert len(episodes) == n_rollouts, len(episodes)
    return report


def _latency(beam_args: list[str], live: list) -> tuple[list[float], int, str]:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"local:{Path(tmp) / 'log'}"
        _write(url, live[:1])  # the topic exists before the pipeline starts
        reward_at: dict[str, int] = {}
        reports: list[RunReport] = []
        producer = threading.Thread(target=lambda: reward_at.update(_write(url, live[1:], 0.005)))
        pipeline = threading.Thread(
            target=lambda: reports.append(
                run_streaming(
                    url, Outputs(url), beam_args, allowed_lateness_s=30, stop_when_idle_s=5
                )
            )
        )
        pipeline.start()
        time.sleep(3)  # let the pipeline start before the producer begins
        producer.start()
        producer.join()
        pipeline.join()
        emitted = {e.rollout_id: e.created_us for e in _episodes(url)}
    latencies = sorted((emitted[k] - v) / 1e6 for k, v in reward_at.items() if k in emitted)
    if not latencies:
        raise SystemExit(
            f"no live episode was emitted ({len(reward_at)} rewards written, "
            f"{len(emitted)} episodes)"
        )
    return latencies, len(reward_at) - len(latencies), reports[0].runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--live-rollouts", type=int, default=40)
    args = parser.parse_args()
    rollouts = [make_rollout(i, f"r{i}", calls=args.calls) for i in range(args.rollouts)]
    n_calls = sum(isinstance(rec, CompletionEvent) for r in rollouts for rec in r.records)
    n_records = sum(len(r.records) for r in rollouts)

    idle = 3.0
    rows: list[tuple[str, float, int]] = []  # (path, seconds, records the source read)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"local:{Path(tmp) / 'log'}"
        _write(url, rollouts)

        # Baseline: read the frames and assemble in plain Python.
        t0 = time.perf_counter()
        by_rollout: dict[str, list] = {}  # type: ignore[type-arg]
        with open_reader(url, [EVENTS_TOPIC], "baseline") as reader:
            while recs := reader.poll(5000, 0.2):
                for rec in recs:
                    for record in decode_message(rec.value):
                        by_rollout.setdefault(getattr(record, "rollout_id", ""), []).append(record)
        baseline = [assemble(k, v, created_us=0) for k, v in by_rollout.items()]
        base_s = time.perf_counter() - t0
        assert len(baseline) == args.rollouts
        rows.append(("plain Python assembly (baseline)", base_s, n_records))

    for label, beam_args in RUNNERS.items():
        with tempfile.TemporaryDirectory() as tmp:  # each runner reads the same log afresh
            url = f"local:{Path(tmp) / 'log'}"
            _write(url, rollouts)
            t0 = time.perf_counter()
            report = _throughput(url, beam_args, args.rollouts, idle)
            seconds = time.perf_counter() - t0 - idle
        assert label in report.runner, (label, report.runner)
        read = report.counters.get("log_records_read", 0)
        rows.append(
            (
                f"Beam {report.runner} streaming (start-up included, idle wait excluded)",
                seconds,
                read,
            )
        )

    print(f"{args.rollouts} rollouts, {n_calls} completion events, {n_records} records in all\n")
    print("| path | seconds | completion events/s | records/s | records read (job's counter) |")
    print("|---|---|---|---|---|")
    for path, seconds, read in rows:
        print(
            f"| {path} | {seconds:.2f} | {n_calls / seconds:,.0f} | {n_records / seconds:,.0f} | "
            f"{read:,} |"
        )
    for path, seconds, _ in rows[1:]:
        print(f"{path.split(' streaming')[0]} / baseline throughput: {base_s / seconds:.2f}x")

    live = [
        make_rollout(10_000 + i, f"live{i}", calls=args.calls) for i in range(args.live_rollouts)
    ]
    print(
        f"\nlive: {len(live) - 1} rollouts written at a call every 5 ms; reward -> episode latency"
    )
    for beam_args in RUNNERS.values():
        latencies, missing, runner = _latency(beam_args, live)
        print(
            f"- {runner}: p50 {statistics.median(latencies):.2f} s, p99 "
            f"{latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]:.2f} s, "
            f"max {latencies[-1]:.2f} s; episodes missing: {missing}"
        )


if __name__ == "__main__":
    main()
