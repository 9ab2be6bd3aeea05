"""Streaming training from live traffic with the services apart (issue #30's "done when"): the
proxy, the pipeline (two jobs, each on two partitions) and the trainer as separate processes on
a 4-partition Kafka log, simulated users in all three dialects (nobody registers a rollout),
feedback late for some sessions and never for others (by session or by response id), a rule
over the recorded calls and the pipeline's judge (the base model on the same vLLM, scoring each
finished session; required) as the other reward sources. Each service is restarted once
mid-traffic (the pipeline's jobs and then the trainer SIGKILLed, the proxy stopped); then every
answered call is recorded once, every session with feedback is trained on exactly once with the
three rewards, every session without it is dead-lettered, a reward after training is counted
and not applied, and the served policy version advanced across the restarts."""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from pathlib import Path

import httpx
import pytest

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, records_in
from infra.local.kafka import KafkaBroker
from infra.local.vllm import VLLMServer
from openforge.serve.apart import Service, ServicesApart, services_apart
from openforge.traffic.ledger import LATE, ledger, rollout_of, trained_ids
from openforge.traffic.simulate import TrafficReport
from schemas.completion import CompletionEvent
from schemas.episode import Episode
from schemas.rollout import RolloutEvent
from tests.openforge.serve.live import (
    LATENESS_S,
    apart_config,
    at_least,
    served_latest,
    traffic,
    until,
    warm_up,
)


def _rollouts(url: str, topic: str, reason: str = "") -> set[str]:
    return {
        e.rollout_id
        for e in records_in(url, topic)
        if isinstance(e, Episode) and reason in (e.dead_letter or "")
    }


def _trained(url: str, out: Path) -> set[str]:
    """The rollouts whose episodes the trainer has trained on."""
    ids = set(trained_ids(out / "trainer"))
    return {
        e.rollout_id
        for e in records_in(url, EPISODES_TOPIC)
        if isinstance(e, Episode) and e.episode_id in ids
    }


def test_live_traffic_trains_the_served_policy_and_a_restart_of_any_service_loses_nothing(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "serve"
    heldout = Path(__file__).resolve().parents[3] / "examples" / "heldout-prompts.jsonl"
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}?partitions=4"
        config = apart_config(
            url, vllm_server, tiny_model_dir, out,
            pipeline_workers=2,  # two jobs, each on two of the four partitions
            reward_weights=("feedback=1", "rule:call_errors=-1", "judge=0.1"),
            reward_required=("feedback", "judge"), judge=True,  # the base model judges
            promotion_prompts=heldout, promotion_max_regression=1.0,  # checked, always served
            promotion_max_tokens=8,
        )  # fmt: skip
        with services_apart(config) as services:
            warm_up(vllm_server)
            stop, result = threading.Event(), dict[str, TrafficReport]()
            thread = traffic(services, stop, result)
            try:
                restarts = _restart_each(services, out)
            finally:
                stop.set()
                thread.join(timeout=180)
            report = result["report"]
            _settle(services, url, out, report)
            served = served_latest(services, out)
            late = _late_feedback(services, report)
            until(
                "the late feedback dead-lettered",
                lambda: late in _rollouts(url, DEAD_LETTER_TOPIC, LATE),
                services,
                timeout=60,
            )
        _check(url, out, report, restarts, served, late)
    logs = sorted(p.name for p in (out / "logs").glob("pipeline-*.log"))
    assert logs == [f"pipeline-{n}.w{i}.log" for n in (1, 2) for i in (0, 1)], logs


def _restart_each(services: ServicesApart, out: Path) -> dict[str, int]:
    """Restart each service once while the users keep going (the trainer while the pipeline is
    still coming back); the proxy's policy version at each restart."""
    seen: dict[str, int] = {}
    for service, after in ((Service.PIPELINE, 1), (Service.TRAINER, 1), (Service.PROXY, 2)):
        until(f"{after} updates", partial(at_least, out, after), services, timeout=240)
        seen[service.value] = services.policy_version()
        if service is Service.PROXY:
            services.stop(service)
            time.sleep(5.0)  # longer than any user's pause (think 1 s, feedback after 2-4 s)
        else:
            services.kill(service)
        services.start(service)
    until("3 updates", partial(at_least, out, 3), services, timeout=240)
    return seen


def _settle(services: ServicesApart, url: str, out: Path, report: TrafficReport) -> None:
    """Wait until every session with feedback is trained on and every other dead-lettered."""
    rewarded = {rollout_of(r) for r in report.results if r.feedback is not None}
    never = {rollout_of(r) for r in report.results if r.plan.feedback_after_s is None}
    until(
        "every session with feedback trained on",
        lambda: rewarded <= _trained(url, out),
        services,
        timeout=120,
    )
    until(
        "every session without feedback dead-lettered",
        lambda: never <= _rollouts(url, DEAD_LETTER_TOPIC),
        services,
        timeout=LATENESS_S + 60,
    )


def _late_feedback(services: ServicesApart, report: TrafficReport) -> str:
    """A second thumbs-up for a session already trained on."""
    rollout_id = next(rollout_of(r) for r in report.results if r.feedback is not None)
    resp = httpx.post(
        f"{services.config.proxy_url}/rollout/{rollout_id}/reward",
        json={"reward": 1.0, "verifier": "feedback"},
        headers={"authorization": f"Bearer {services.feedback_token}"},
        timeout=30,
    )
    assert resp.status_code == 201, resp.text
    return rollout_id


def _check(
    url: str, out: Path, report: TrafficReport, restarts: dict[str, int], served: int, late: str
) -> None:
    counts = report.counts()
    why = report.failures()
    assert counts["calls_failed"] == 0 and counts["feedback_failed"] == 0, (counts, why)
    assert counts["feedback_posted"] >= 3 and counts["feedback_never"] >= 1, counts
    assert counts["feedback_by_response"] >= 1, counts  # by response id, as well as by session
    # The proxy's restart was seen by the users, and ridden out.
    assert counts["calls_retried"] + counts["feedback_retried"] >= 1, counts

    # Every answered call recorded once; each session one episode or one dead letter; each
    # episode trained on once, across the trainer's restart; the late reward counted.
    book = ledger(url, report, out / "trainer")
    assert (book.lost, book.trained_twice, book.late_rewards) == (0, 0, 1), book
    assert book.recorded == book.served == counts["calls_answered"], book
    assert book.episodes == book.trained == counts["feedback_posted"], book
    assert book.dead_lettered == counts["feedback_never"], book

    # The three reward sources in each episode; every dialect seen; the sessions' own rollouts.
    results = {rollout_of(r): r for r in report.results}
    episodes = [e for e in records_in(url, EPISODES_TOPIC) if isinstance(e, Episode)]
    for episode in episodes:
        feedback = results[episode.rollout_id].feedback
        assert episode.reward_components["feedback"] == feedback
        values = episode.reward_components
        assert 0.0 <= values["judge"] <= 1.0, values
        expected = feedback - values["rule:call_errors"] + 0.1 * values["judge"]
        assert episode.reward == pytest.approx(expected), values
    calls = [e for e in records_in(url, EVENTS_TOPIC) if isinstance(e, CompletionEvent)]
    assert {e.dialect.value for e in calls} == {"chat", "responses", "messages"}
    assert {e.rollout_id for e in calls} == set(results)
    started = [e for e in records_in(url, EVENTS_TOPIC) if isinstance(e, RolloutEvent)]
    assert {e.metadata.get("session") for e in started} == {r.plan.session for r in report.results}

    # The served policy advanced through every restart, and the calls' tokens carried it.
    lines = (out / "trainer" / "versions.jsonl").read_text().splitlines()
    versions = [json.loads(line)["version"] for line in lines]
    assert versions == sorted(set(versions)) and served == versions[-1] >= 3, versions
    checks = [json.loads(line) for line in (out / "trainer" / "promotions.jsonl").open()]
    assert len(checks) >= 3 and all(c["promoted"] for c in checks), checks  # every sync gated
    assert 1 <= restarts["pipeline"] <= restarts["trainer"] <= restarts["proxy"], restarts
    assert len(book.versions_stamped) >= 2 and max(book.versions_stamped) >= restarts["proxy"]
