"""Streaming training from live traffic with the services apart (issue #30's "done when"): the
proxy, the pipeline and the trainer as three processes on a 4-partition Kafka log, simulated
users in all three dialects (nobody registers a rollout), feedback late for some sessions and
never for others, a rule over the recorded calls as the second reward source. Each service is
restarted once mid-traffic (the pipeline and the trainer SIGKILLed, the proxy stopped); then
every answered call is recorded once, every session with feedback is trained on exactly once
with both rewards, every session without it is dead-lettered, a reward after training is
counted and not applied, and the served policy version advanced across the restarts."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC
from infra.local.kafka import KafkaBroker
from infra.local.process import free_port
from infra.local.vllm import VLLMServer
from openforge.serve.apart import ApartConfig, Service, ServicesApart, services_apart
from openforge.testing.proxy import read_events
from openforge.traffic.simulate import TrafficConfig, TrafficReport, run
from openforge.traffic.users import SessionResult
from pipeline.sinks import episodes_in
from schemas.completion import CompletionEvent
from schemas.enums import CompletionStatus
from schemas.episode import Episode

LATENESS_S = 10.0  # the pipeline's deadline: feedback comes 2-4 s after a session's last answer


def _until(what: str, done: Callable[[], bool], services: ServicesApart, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        services.check_alive()
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def _trained(out: Path) -> list[str]:
    ledger = out / "trainer" / "consumed.jsonl"
    if not ledger.exists():
        return []
    return [e for line in ledger.read_text().splitlines() for e in json.loads(line)["episodes"]]


def _updates(out: Path) -> int:
    ledger = out / "trainer" / "consumed.jsonl"
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


def _at_least(out: Path, updates: int) -> bool:
    return _updates(out) >= updates


def _rollout(result: SessionResult) -> str:
    return f"session-{result.plan.session}"


def _late_rewards(url: str) -> set[str]:
    """The rollouts with a reward dead-lettered as late (after their episode went out)."""
    return {
        e.rollout_id for e in episodes_in(url, DEAD_LETTER_TOPIC) if "late" in (e.dead_letter or "")
    }


def _latest(episodes: list[Episode]) -> dict[str, Episode]:
    return {e.rollout_id: e for e in episodes}


def _traffic(
    services: ServicesApart, stop: threading.Event, out: dict[str, TrafficReport]
) -> threading.Thread:
    cfg = TrafficConfig(
        services.config.proxy_url,
        users=3,
        sessions=None,  # until the test says stop
        turns=2,
        feedback_fraction=0.7,
        feedback_delay_s=(2.0, 4.0),  # after the session's last answer: the proxy ends it at 1.5 s
        think_s=0.2,
        max_tokens=8,
        feedback_token=services.feedback_token,
    )
    thread = threading.Thread(target=lambda: out.update(report=run(cfg, lambda: not stop.is_set())))
    thread.start()
    return thread


def test_live_traffic_trains_the_served_policy_and_a_restart_of_any_service_loses_nothing(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "serve"
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}?partitions=4"
        config = ApartConfig(
            url, vllm_server.base_url, tiny_model_dir, out, port=free_port(),
            session_idle_s=1.5, lateness_s=LATENESS_S, lr=1e-2,
            reward_weights=("feedback=1", "rule:call_errors=-1"), reward_required=("feedback",),
        )  # fmt: skip
        with services_apart(config) as services:
            stop, result = threading.Event(), dict[str, TrafficReport]()
            thread = _traffic(services, stop, result)
            try:
                versions = _restart_each(services, out)
            finally:
                stop.set()
                thread.join(timeout=180)
            report = result["report"]
            rewarded = {_rollout(r) for r in report.results if r.feedback is not None}
            _until(
                "every session with feedback trained on",
                lambda: rewarded <= set(_trained(out)),
                services,
                timeout=120,
            )
            served = services.policy_version()
            late = _late_feedback(services, sorted(rewarded)[0])
            _until(
                "the late feedback dead-lettered",
                lambda: late in _late_rewards(url),
                services,
                timeout=60,
            )
        _check(url, out, report, rewarded, versions, served, late)


def _restart_each(services: ServicesApart, out: Path) -> dict[str, int]:
    """Restart each service once while the users keep going; the proxy's policy version at
    each restart."""
    seen: dict[str, int] = {}
    for service, after in ((Service.PIPELINE, 1), (Service.TRAINER, 3), (Service.PROXY, 5)):
        _until(f"{after} updates", partial(_at_least, out, after), services, timeout=240)
        seen[service.value] = services.policy_version()
        if service is Service.PROXY:
            services.stop(service)
        else:
            services.kill(service)
        services.start(service)
    _until("7 updates", partial(_at_least, out, 7), services, timeout=240)
    return seen


def _late_feedback(services: ServicesApart, rollout_id: str) -> str:
    """A second thumbs-up for a session already trained on."""
    resp = httpx.post(
        f"{services.config.proxy_url}/rollout/{rollout_id}/reward",
        json={"reward": 1.0, "verifier": "feedback"},
        headers={"authorization": f"Bearer {services.feedback_token}"},
        timeout=30,
    )
    assert resp.status_code == 201, resp.text
    return rollout_id


def _check(
    url: str,
    out: Path,
    report: TrafficReport,
    rewarded: set[str],
    restarts: dict[str, int],
    served: int,
    late: str,
) -> None:
    counts = report.counts()
    assert counts["calls_failed"] == 0 and counts["feedback_failed"] == 0, counts
    assert counts["feedback_posted"] >= 3 and counts["feedback_never"] >= 1, counts
    assert counts["calls_retried"] >= 1, counts  # the proxy's restart was seen, and rode out

    # Every answered call recorded once (event ids deduplicate the log's at-least-once).
    records = read_events(url, group="check", want=1)
    events = {e.event_id: e for e in records if isinstance(e, CompletionEvent)}
    ok = Counter(e.rollout_id for e in events.values() if e.status is CompletionStatus.OK)
    assert {_rollout(r): r.answered for r in report.results} == {
        _rollout(r): ok[_rollout(r)] for r in report.results
    }
    dialects = {e.dialect for e in events.values()}
    assert len(dialects) == 3, dialects

    # Each session with feedback: one episode with both reward sources; without: dead-lettered.
    episodes = list(episodes_in(url, EPISODES_TOPIC))
    assert len({e.episode_id for e in episodes}) == len(episodes)  # written once
    by_rollout = _latest(episodes)
    assert set(by_rollout) == rewarded
    for r in report.results:
        rollout = _rollout(r)
        if rollout in rewarded:
            episode = by_rollout[rollout]
            assert episode.reward_components["feedback"] == r.feedback
            assert episode.reward == r.feedback - episode.reward_components["rule:call_errors"]
    dead = _latest(list(episodes_in(url, DEAD_LETTER_TOPIC)))
    never = {_rollout(r) for r in report.results if r.plan.feedback_after_s is None}
    assert never <= set(dead), never - set(dead)
    assert all("feedback" in (dead[n].dead_letter or "") for n in never)

    # Trained on exactly once each, across the trainer's restart; the late reward not applied.
    trained = _trained(out)
    assert len(trained) == len(set(trained))
    assert set(trained) == {by_rollout[r].episode_id for r in rewarded}
    assert "late" in (dead[late].dead_letter or "")

    # The served policy advanced through every restart, and calls carried each new version.
    lines = (out / "trainer" / "versions.jsonl").read_text().splitlines()
    versions = [json.loads(line)["version"] for line in lines]
    assert versions == sorted(set(versions)) and served == versions[-1] >= 7
    assert restarts["pipeline"] >= 1 and restarts["proxy"] >= restarts["trainer"] >= 1
    stamped = {s.version for e in events.values() for s in e.policy_versions}
    assert len(stamped) >= 4 and max(stamped) >= restarts["proxy"], stamped
