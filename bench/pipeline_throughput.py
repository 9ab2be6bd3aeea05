"""Episode assembly on Beam's local runner: events per second, and reward-to-episode latency.

    .venv/bin/python -m bench.pipeline_throughput [--rollouts 400] [--calls 10]

1. Throughput: ROLLOUTS rollouts of CALLS completion events (with forks, retries, duplicates,
   side calls; see tests/pipeline/rollouts.py) plus their rewards and ends are written to an
   embedded local log; the streaming pipeline (FnApiRunner, ``--streaming``) reads, assembles and
   writes every episode. Baseline, side by side: the same frames read and assembled in a plain
   Python loop (no Beam), which bounds what the runner adds.
2. Latency: while the pipeline runs, a producer writes rollouts live (a call every 5 ms); for each
   episode, the time from its reward's write to the episode's emission.
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
from pipeline.jobs import Outputs, run_streaming
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--live-rollouts", type=int, default=40)
    args = parser.parse_args()
    rollouts = [make_rollout(i, f"r{i}", calls=args.calls) for i in range(args.rollouts)]
    n_calls = sum(isinstance(rec, CompletionEvent) for r in rollouts for rec in r.records)
    n_records = sum(len(r.records) for r in rollouts)

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
                        by_rollout.setdefault(record.rollout_id, []).append(record)
        baseline = [assemble(k, v, created_us=0) for k, v in by_rollout.items()]
        base_s = time.perf_counter() - t0
        assert len(baseline) == args.rollouts

        # Beam streaming pipeline on the local runner (stops 3 s after the log goes idle).
        idle = 3.0
        t0 = time.perf_counter()
        run_streaming(url, Outputs(url), allowed_lateness_s=30, stop_when_idle_s=idle)
        beam_s = time.perf_counter() - t0 - idle
        episodes = _episodes(url)
        assert len(episodes) == args.rollouts, len(episodes)

    print(f"{args.rollouts} rollouts, {n_calls} completion events, {n_records} records in all\n")
    print("| path | seconds | completion events/s | records/s |")
    print("|---|---|---|---|")
    print(
        f"| plain Python assembly (baseline) | {base_s:.2f} | {n_calls / base_s:,.0f} | "
        f"{n_records / base_s:,.0f} |"
    )
    print(
        f"| Beam FnApiRunner streaming (start-up included, idle wait excluded) | {beam_s:.2f} | "
        f"{n_calls / beam_s:,.0f} | {n_records / beam_s:,.0f} |"
    )
    print(f"\nBeam / baseline throughput: {base_s / beam_s:.2f}x")

    live = [
        make_rollout(10_000 + i, f"live{i}", calls=args.calls) for i in range(args.live_rollouts)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"local:{Path(tmp) / 'log'}"
        _write(url, live[:1])  # the topic exists before the pipeline starts
        reward_at: dict[str, int] = {}
        producer = threading.Thread(target=lambda: reward_at.update(_write(url, live[1:], 0.005)))
        pipeline = threading.Thread(
            target=run_streaming,
            args=(url, Outputs(url)),
            kwargs={"allowed_lateness_s": 30, "stop_when_idle_s": 5},
        )
        pipeline.start()
        time.sleep(3)  # let the pipeline start before the producer begins
        producer.start()
        producer.join()
        pipeline.join()
        emitted = {e.rollout_id: e.created_us for e in _episodes(url)}
    latencies = [(emitted[k] - v) / 1e6 for k, v in reward_at.items() if k in emitted]
    if not latencies:
        raise SystemExit(
            f"no live episode was emitted ({len(reward_at)} rewards written, "
            f"{len(emitted)} episodes)"
        )
    missing = len(reward_at) - len(latencies)
    latencies.sort()
    print(
        f"\nlive: {len(reward_at)} rollouts written at a call every 5 ms; reward -> episode "
        f"latency p50 {statistics.median(latencies):.2f} s, p99 "
        f"{latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]:.2f} s, "
        f"max {latencies[-1]:.2f} s; episodes missing: {missing}"
    )


if __name__ == "__main__":
    main()
