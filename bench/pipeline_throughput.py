"""Episode assembly on the default runner (Beam's in-process FnApiRunner: the job given no
``--runner``) and on Beam's portable runner Prism, side by side: events per second, and
reward-to-episode latency. This bench chose the default (the sustained rows below).

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

    .venv/bin/python -m bench.pipeline_throughput --sustained [--rates 250 500 1000 2000 4000]
        [--duration 60] [--runners FnApiRunner Prism]

3. Sustained live load (``--sustained``), per runner and rate, rates ascending until one is not
   kept up: a producer process writes events at the rate for ``--duration`` s
   (``bench.live_load``) while the streaming job runs. "Kept up": every rollout's episode is
   out, the last within ``--drain`` s of the producer's last write, the backlog did not grow
   (its maximum over the last third of the run at most 1.25x that of the first third, +10),
   and the producer held its rate. Latency: from a rollout's reward being written to its
   episode's append to the episodes topic (the log's own stamp). Backlog: rollouts rewarded
   whose episode is not out yet, at the end of each second. Each row names the runner and the
   records its source read (the job's report), which must equal the records written.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.live_load import Produced, backlog, episode_times, percentile, produce_in_process
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


# label -> Beam args. FnApiRunner is asked for by no --runner at all, so its rows are the
# default's path; each row asserts the runner the job's own report names.
RUNNERS = {"FnApiRunner": [], "Prism": ["--runner=PrismRunner"]}


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


WARMUP = make_rollout(1, "warmup", calls=2)


def _sustained_step(
    beam_args: list[str], rate: float, args: argparse.Namespace
) -> tuple[Produced, dict[str, float], RunReport]:
    """One run: the streaming job, then the producer at ``rate`` once the job is up."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"local:{Path(tmp) / 'log'}"
        _write(url, [WARMUP])  # the topic exists, and its episode shows the job is up
        spawn = multiprocessing.get_context("spawn")
        ready, go, results = spawn.Event(), spawn.Event(), spawn.Queue()
        producer = spawn.Process(
            target=produce_in_process,
            args=(url, rate, args.duration, args.in_flight, args.calls, ready, go, results),
        )
        producer.start()  # it prepares its frames, then waits for the job to be up
        if not ready.wait(120):
            raise SystemExit("the producer was not ready in 120 s")

        def release() -> None:  # the producer starts once the job has emitted the warm-up
            deadline = time.monotonic() + 120
            while "warmup" not in episode_times(url) and time.monotonic() < deadline:
                time.sleep(0.1)
            go.set()

        threading.Thread(target=release, daemon=True).start()
        # In the main thread: Prism's job server installs a signal handler when it starts.
        report = run_streaming(
            url, Outputs(url), beam_args, allowed_lateness_s=30, stop_when_idle_s=3
        )
        if not go.is_set() or producer.exitcode not in (None, 0):
            producer.terminate()
            raise SystemExit("the streaming job ended before its warm-up episode came out")
        produced = results.get(timeout=60)
        producer.join()
        emitted = episode_times(url)
    emitted.pop("warmup", None)
    return produced, emitted, report


def sustained(args: argparse.Namespace) -> None:
    print(
        f"sustained live load: {args.duration:.0f} s per step, {args.in_flight} rollouts in "
        f"flight, {args.calls} calls per rollout; kept up = all episodes out within "
        f"{args.drain:.0f} s of the last write, the backlog's maximum in the last third of the "
        "run at most 1.25x (+10) that of the first third, and the producer at >= 98% of its "
        "rate\n"
    )
    print(
        "| runner | target records/s | achieved records/s | completion events/s | rollouts "
        "| records read (job's counter) | missing | drain s | backlog max (first / last third) "
        "| reward -> episode p50 / p99 / max s | kept up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    best: dict[str, tuple[float, float, float] | None] = {}
    for label in args.runners:
        best[label] = None
        for rate in args.rates:
            produced, emitted, report = _sustained_step(RUNNERS[label], rate, args)
            assert label in report.runner, (label, report.runner)
            lat = [emitted[k] - v for k, v in produced.reward_at.items() if k in emitted]
            missing = len(produced.reward_at) - len(lat)
            drain = max(emitted.values(), default=float("inf")) - produced.stopped
            seconds = range(int(produced.started) + 1, int(produced.stopped) + 1)
            levels = [backlog(produced, emitted, t) for t in seconds]
            third = max(1, len(levels) // 3)
            first, last = max(levels[:third], default=0), max(levels[-third:], default=0)
            ok = (
                missing == 0
                and drain <= args.drain
                and produced.achieved >= 0.98 * rate
                and last <= 1.25 * first + 10  # the backlog did not grow
                and bool(lat)
            )
            p50, p99 = (statistics.median(lat), percentile(lat, 0.99)) if lat else (0.0, 0.0)
            read = report.counters.get("log_records_read", 0)
            written = produced.records + len(WARMUP.records)
            print(
                f"| {report.runner} | {rate:,.0f} | {produced.achieved:,.0f} | "
                f"{produced.completions / (produced.stopped - produced.started):,.0f} | "
                f"{len(produced.reward_at):,} | {read:,} (written {written:,}) | "
                f"{missing} | {drain:.2f} | {first} / {last} | {p50:.2f} / {p99:.2f} / "
                f"{max(lat, default=0.0):.2f} | {'yes' if ok else 'no'} |",
                flush=True,
            )
            if not ok:
                break
            best[label] = (rate, p50, p99)
    for label, b in best.items():
        if b is None:
            print(f"{label}: kept up with none of the rates")
        else:
            print(
                f"{label}: highest rate kept up {b[0]:,.0f} records/s, p50 {b[1]:.2f} s, "
                f"p99 {b[2]:.2f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--live-rollouts", type=int, default=40)
    parser.add_argument("--sustained", action="store_true", help="the sustained live load only")
    parser.add_argument("--rates", type=float, nargs="+", default=[250, 500, 1000, 2000, 4000])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--drain", type=float, default=5.0)
    parser.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS))
    args = parser.parse_args()
    if args.sustained:
        sustained(args)
        return
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
