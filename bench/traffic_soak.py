"""A compressed day of production traffic against the services apart: served, recorded, lost,
duplicated and trained counts, the proxy's memory over time, reward-to-update latency and the
policy staleness of what was trained.

    .venv/bin/python -m bench.traffic_soak [--minutes 8] [--users 4] [--restarts] [--judge]
        [--promotion MAX_REGRESSION]

The code path measured is streaming training from live traffic as ``openforge serve`` runs it
(:mod:`openforge.serve.apart`): a Kafka broker (4 partitions a topic), vLLM on the tiny model, and
three processes: ``openforge proxy --open`` (sessions end after ``--session-idle`` seconds, 2 here:
a day's 30 minutes compressed 900 times), ``openforge pipeline run`` (the reward is the users'
feedback minus the share of failed calls, ``rule:call_errors``; feedback is required, a session
without it is dead-lettered 30 s after its last event) and ``openforge trainer run
--serve-at-start`` (an update per 4 episodes, each hot-loaded into vLLM and stamped by the proxy; an
episode more than 8 versions behind is dropped, and counted). ``openforge.traffic`` plays
``--users`` users, each a stream of 2-turn sessions in Chat Completions, Responses and Anthropic
Messages in turn; 70% of the sessions get feedback 1-6 s after their last answer (after the proxy
ended them: late), the rest never. ``--restarts`` kills the pipeline and the trainer (SIGKILL) and
stops the proxy, once each, spread over the run. ``--judge`` adds the pipeline's judge (the base
model on the same vLLM scores each finished session, a reward ``judge`` weighted 0.2 and
required); ``--promotion X`` gates each weight sync on ``examples/heldout-prompts.jsonl``
(served only if its held-out score is at most X below the served policy's): the run then
reports judge rewards posted and the checks promoted and held.

Proof of path: every call is attributed by its session header to a ``session-<id>`` rollout
(none is registered), the episodes carry both reward sources, and the trainer's versions
advance on vLLM and on the calls' tokens. The baseline side by side is the proxy's own memory
at the first sample: the figure is its growth over the run (flat: idle sessions are ended and
forgotten). Latency is from the feedback's post (the simulator's clock) to the first poll of the
trainer's ledger that lists its episode (every 0.2 s); staleness is the trained version minus
the oldest version of an episode's tokens, from the step lineage.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from infra.eventlog import EVENTS_TOPIC, records_in
from infra.local.kafka import KafkaBroker
from infra.local.process import free_port
from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.tiny_model import build_tiny_model
from openforge.serve.apart import ApartConfig, Service, ServicesApart, services_apart
from openforge.traffic.ledger import ledger, rollout_of, trained_ids
from openforge.traffic.simulate import TrafficConfig, TrafficReport, run
from schemas.episode import episode_id_for
from schemas.reward import RewardEvent

SESSION_IDLE_S = 2.0
LATENESS_S = 30.0
HELDOUT = Path(__file__).resolve().parents[1] / "examples" / "heldout-prompts.jsonl"


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        / 1024
    )


class Watch:
    """Samples the proxy's memory and stamps when each episode first shows in the ledger."""

    def __init__(self, services: ServicesApart, out: Path) -> None:
        self.services, self.out = services, out
        self.memory: list[tuple[float, int, float]] = []  # (seconds, proxy start, RSS MB)
        self.remembered: list[tuple[int, int]] = []  # the proxy's (live, finished) rollouts
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()
        self.t0 = time.time()

    def run(self) -> None:
        last = 0.0
        while not self.stop.wait(0.2):
            for episode in trained_ids(self.out / "trainer"):
                self.seen.setdefault(episode, time.time())
            proxy = next(iter(self.services.processes.get(Service.PROXY) or []), None)
            if proxy is not None and proxy.pid and time.time() - last >= 5:
                last = time.time()
                with contextlib.suppress(FileNotFoundError, StopIteration, httpx.HTTPError):
                    self.memory.append(
                        (last - self.t0, self.services.starts[Service.PROXY], rss_mb(proxy.pid))
                    )
                    health = httpx.get(f"{self.services.config.proxy_url}/health", timeout=5)
                    counts = health.json()
                    self.remembered.append((counts["rollouts"], counts["finished_rollouts"]))


def soak(args: argparse.Namespace, tmp: Path) -> None:
    model = build_tiny_model(default_tiny_dir())
    out = tmp / "serve"
    with (
        KafkaBroker(data_dir=tmp / "kafka") as broker,
        VLLMServer(model) as vllm,
    ):
        url = f"kafka://{broker.bootstrap}?partitions=4"
        judged = ("judge=0.2",) if args.judge else ()
        config = ApartConfig(
            url, vllm.base_url, model, out, port=free_port(), session_idle_s=SESSION_IDLE_S,
            lateness_s=LATENESS_S, lr=1e-2,
            reward_weights=("feedback=1", "rule:call_errors=-1", *judged),
            reward_required=("feedback", *(["judge"] if args.judge else [])), judge=args.judge,
            promotion_prompts=HELDOUT if args.promotion is not None else None,
            promotion_max_regression=args.promotion or 0.0, promotion_max_tokens=16,
        )  # fmt: skip
        with services_apart(config) as services:
            watch = Watch(services, out)
            watcher = threading.Thread(target=watch.run)
            watcher.start()
            report = _traffic(services, args)
            time.sleep(LATENESS_S + 10)  # the last sessions' deadlines, then their training
            watch.stop.set()
            watcher.join()
            served_version = services.policy_version()
        _report(url, out, report, watch, served_version, args)


def _traffic(services: ServicesApart, args: argparse.Namespace) -> TrafficReport:
    end = time.monotonic() + args.minutes * 60
    cfg = TrafficConfig(
        services.config.proxy_url, users=args.users, sessions=None, turns=2,
        feedback_fraction=0.7, feedback_delay_s=(1.0, 6.0), think_s=0.5, max_tokens=8,
        feedback_token=services.feedback_token,
    )  # fmt: skip
    result: dict[str, TrafficReport] = {}
    thread = threading.Thread(
        target=lambda: result.update(report=run(cfg, lambda: time.monotonic() < end))
    )
    thread.start()
    if args.restarts:
        for i, service in enumerate((Service.PIPELINE, Service.TRAINER, Service.PROXY)):
            time.sleep(args.minutes * 60 / 4 - (5 if i else 0))
            if service is Service.PROXY:
                services.stop(service)
            else:
                services.kill(service)
            services.start(service)
    thread.join()
    return result["report"]


def _latencies(report: TrafficReport, seen: dict[str, float]) -> list[float]:
    out = []
    for r in report.results:
        episode = episode_id_for(rollout_of(r))
        if r.feedback_at is not None and episode in seen:
            out.append(seen[episode] - r.feedback_at)
    return out


def _staleness(trainer_out: Path) -> tuple[float, float, int]:
    """The mean (over episodes) and max of each update's staleness, and the episodes dropped as
    stale (``metrics.csv``; its stream counters start again at 0 in a restarted trainer)."""
    rows = list(csv.DictReader((trainer_out / "metrics.csv").read_text().splitlines()))
    n = sum(float(r["data/episodes"]) for r in rows)
    mean = sum(float(r["staleness/mean"]) * float(r["data/episodes"]) for r in rows) / n
    drops = [int(float(r["stream/stale_dropped"])) for r in rows]
    dropped = sum(a for a, b in zip(drops, [*drops[1:], 0], strict=True) if b < a)
    return mean, max(float(r["staleness/max"]) for r in rows), dropped


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else float("nan")


def _report(
    url: str, out: Path, report: TrafficReport, watch: Watch, served: int, args: argparse.Namespace
) -> None:
    book = ledger(url, report, out / "trainer")
    print("traffic:", report.counts())
    print("ledger:", book.counts())
    lat = _latencies(report, watch.seen)
    print(
        f"reward-to-update latency: n={len(lat)} p50 {_pct(lat, 50):.1f} s, "
        f"p99 {_pct(lat, 99):.1f} s"
    )
    mean, worst, dropped = _staleness(out / "trainer")
    print(f"staleness of trained episodes (policy versions): mean {mean:.2f}, max {worst:.0f}")
    print(f"episodes dropped as stale (beyond --max-staleness 8): {dropped}")
    for start in sorted({m[1] for m in watch.memory}):
        series = [m for m in watch.memory if m[1] == start]
        every = series[:: max(1, len(series) // 8)] + series[-1:]
        print(f"proxy (start {start}) RSS MB by second: " + ", ".join(
            f"{t:.0f}: {mb:.0f}" for t, _, mb in every
        ))  # fmt: skip
    print(f"proxy live/finished rollouts held, last samples: {watch.remembered[-3:]}")
    print(f"policy version served at the end: {served}")
    _extras(url, out)
    assert book.lost == 0 and book.trained_twice == 0 and served > 0, book


def _extras(url: str, out: Path) -> None:
    """The judge's rewards and the promotion checks, where the run had them."""
    verdicts = [r for r in records_in(url, EVENTS_TOPIC) if isinstance(r, RewardEvent)]
    judged = [r for r in verdicts if r.verifier == "judge"]
    if judged:
        scores = [r.reward for r in judged]
        print(f"judge rewards: {len(judged)} ({len({r.rollout_id for r in judged})} sessions), "
              f"mean score {statistics.mean(scores):.3f}")  # fmt: skip
    checks = out / "trainer" / "promotions.jsonl"
    if checks.exists():
        lines = [json.loads(line) for line in checks.read_text().splitlines()]
        promoted = sum(bool(c["promoted"]) for c in lines)
        print(f"promotion checks: {len(lines)}, promoted {promoted}, held {len(lines) - promoted}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--restarts", action="store_true")
    parser.add_argument("--judge", action="store_true")
    parser.add_argument("--promotion", type=float, default=None, metavar="MAX_REGRESSION")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="openforge-soak-") as tmp:
        soak(args, Path(tmp))
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
