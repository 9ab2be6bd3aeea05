"""The pipelines on the default runner (FnApiRunner) and on Prism: streaming from the event log,
replay from the archive, and end to end from a proxy in front of real vLLM through a real Kafka
broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, open_reader, open_writer
from infra.local.kafka import KafkaBroker
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import (
    RunningProxy,
    completions_of,
    proxy_config,
    read_events,
    running_proxy,
)
from openforge.testing.rollouts import make_rollout
from pipeline.jobs import Outputs, run_replay, run_streaming
from schemas.archive import read_archive
from schemas.codec import decode_message, encode_message
from schemas.completion import CompletionEvent
from schemas.delta import Reconstructor
from schemas.episode import Episode, episode_id_for
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent


def _episodes(url: str, topic: str, group: str) -> list[Episode]:
    with open_reader(url, [topic], group) as reader:
        out = []
        while recs := reader.poll(1000, 2.0):
            out += [e for rec in recs for e in decode_message(rec.value)]
    assert all(isinstance(e, Episode) for e in out)
    return out  # type: ignore[return-value]


def _summary(episodes: list[Episode]) -> dict[str, tuple[object, ...]]:
    return {
        e.rollout_id: (
            e.reward,
            [s.token_ids for s in e.samples],
            [s.loss_mask for s in e.samples],
            e.dead_letter,
        )
        for e in episodes
    }


@pytest.mark.parametrize(
    ("beam_args", "runner"), [((), "FnApiRunner"), (("--runner=PrismRunner",), "PrismRunner")]
)
def test_streaming_from_the_local_log_and_replay_from_the_archive_agree(
    tmp_path: Path, beam_args: tuple[str, ...], runner: str
) -> None:
    """The streaming job archives the events it reads (each event id once, a bad frame counted
    and skipped) beside its episodes; a replay of that archive rebuilds the same episodes. With
    no ``--runner`` both run on FnApiRunner; Prism, asked for, does the same."""
    url = f"local:{tmp_path / 'log'}"
    # Enough rollouts that the assembly's timers fire in bundles of many (see pipeline.jobs).
    rollouts = [make_rollout(i, f"r{i}", calls=6, with_reward=i != 2) for i in range(120)]
    records = [rec for r in rollouts for rec in r.records]  # with duplicate deliveries
    with open_writer(url) as writer:
        for rec in records:
            writer.append(EVENTS_TOPIC, rec.rollout_id.encode(), encode_message([rec]))
        writer.append(EVENTS_TOPIC, b"r-garbled", b"OF not a frame")

    streaming = run_streaming(
        url, Outputs(url, run_archive=str(tmp_path / "stream")), beam_args,
        allowed_lateness_s=5, stop_when_idle_s=3,
    )  # fmt: skip
    replay = run_replay(
        str(tmp_path / "stream"), Outputs(None, str(tmp_path / "replay")), beam_args,
        allowed_lateness_s=5,
    )  # fmt: skip
    assert streaming.runner == replay.runner == runner
    assert streaming.counters["log_records_read"] == len(records) + 1
    assert streaming.counters["episodes_emitted"] == len(rollouts) - 1
    distinct = {r.event_id: r for r in records}  # type: ignore[union-attr]
    assert streaming.counters["events_archived"] == len(distinct)
    assert streaming.counters["events_already_archived"] == len(records) - len(distinct)
    assert streaming.counters["events_not_archived"] == 1
    archived = [
        r
        for cls in (CompletionEvent, RolloutEvent, RewardEvent)
        for r in read_archive(tmp_path / "stream", cls)
    ]
    assert sorted(archived, key=repr) == sorted(distinct.values(), key=repr)

    streamed = _episodes(url, EPISODES_TOPIC, "t") + _episodes(url, DEAD_LETTER_TOPIC, "t")
    replayed = list(read_archive(tmp_path / "replay" / "episodes", Episode)) + list(
        read_archive(tmp_path / "replay" / "deadletter", Episode)
    )
    assert _summary(streamed) == _summary(replayed)
    summary = _summary(streamed)
    for r in rollouts:
        reward, tokens, masks, dead = summary[r.rollout_id]
        assert tokens == [s.tokens for s in r.samples] and masks == [s.mask for s in r.samples]
        assert (reward, dead) == (
            (None, "no reward by the deadline") if r.rollout_id == "r2" else (r.reward, None)
        )
    # One archive root: episodes and the dead letter side by side (record=episode).
    in_archive = {e.episode_id: e.dead_letter for e in read_archive(tmp_path / "stream", Episode)}
    assert in_archive == {
        episode_id_for(r.rollout_id): "no reward by the deadline" if r.rollout_id == "r2" else None
        for r in rollouts
    }


def _converse(p: RunningProxy, rollout: str) -> None:
    """Three turns of a chat through the proxy ``p``, then the rollout's reward and its end."""
    info = p.register(rollout, task_id="task-e2e", group_id="g1", harness="sdk")
    client = openai.OpenAI(base_url=f"{p.url}/v1", api_key=info["api_key"])
    history: list[dict[str, str]] = [{"role": "user", "content": "Write hello to a file."}]
    for turn in range(3):
        answer = client.chat.completions.create(
            model="agent",
            messages=history,  # type: ignore[arg-type]
            max_tokens=12,
            temperature=1.0,
            seed=turn,
        )
        history += [
            {"role": "assistant", "content": answer.choices[0].message.content or ""},
            {"role": "user", "content": f"Next step {turn}."},
        ]
    import httpx

    assert (
        httpx.post(
            f"{p.url}/rollout/{rollout}/reward", json={"reward": 1.0}, headers=p.admin_headers
        ).status_code
        == 201
    )
    assert (
        httpx.post(
            f"{p.url}/admin/rollouts/{rollout}/finish",
            json={"exit_code": 0},
            headers=p.admin_headers,
        ).status_code
        == 200
    )


def test_proxy_to_kafka_to_pipeline_to_episodes_topic(
    vllm_server: VLLMServer, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    rollout = f"e2e-{uuid.uuid4().hex[:6]}"
    config = proxy_config(vllm_server.base_url, tmp_path, log_url=kafka_broker.url)
    with running_proxy(config) as p:
        _converse(p, rollout)
        p.flush()
    calls = completions_of(read_events(kafka_broker.url, group=f"{rollout}-check", want=5), rollout)
    assert len(calls) == 3

    run_streaming(
        kafka_broker.url, Outputs(kafka_broker.url), allowed_lateness_s=30, stop_when_idle_s=4
    )

    (episode,) = [
        e for e in _episodes(kafka_broker.url, EPISODES_TOPIC, rollout) if e.rollout_id == rollout
    ]
    assert episode.episode_id == episode_id_for(rollout)
    assert episode.reward == 1.0 and episode.task_id == "task-e2e" and episode.group_id == "g1"
    (sample,) = episode.samples  # three exact turns merge into one sample
    rebuild = Reconstructor()
    prompts = [rebuild.prompt(c) for c in calls]
    assert sample.token_ids == prompts[-1] + calls[-1].completion_token_ids
    generated = [i for i, m in enumerate(sample.loss_mask) if m]
    expected = [
        pos
        for c, pr in zip(calls, prompts, strict=True)
        for pos in range(len(pr), len(pr) + len(c.completion_token_ids))
    ]
    assert generated == expected
    assert [sample.behavior_logprobs[i] for i in generated] == [
        lp for c in calls for lp in c.completion_logprobs
    ]
    assert set(episode.lineage) >= {c.event_id for c in calls}


def test_streaming_jobs_on_prism_are_not_cut_off_by_the_job_service_timeout() -> None:
    from apache_beam.options.pipeline_options import PortableOptions

    from pipeline.jobs import STREAMING_JOB_TIMEOUT_S, options

    # Beam applies job_server_timeout (300 s by default) to the job's message stream: a
    # streaming job would end with DEADLINE_EXCEEDED after five minutes.
    prism = ["--runner=PrismRunner"]
    assert options(prism, streaming=True).view_as(PortableOptions).job_server_timeout == (
        STREAMING_JOB_TIMEOUT_S
    )
    assert options(prism, streaming=False).view_as(PortableOptions).job_server_timeout == 300
    chosen = options([*prism, "--job_server_timeout=42"], streaming=True)
    assert chosen.view_as(PortableOptions).job_server_timeout == 42


def test_a_long_run_on_the_default_runner_still_reports_its_counters(tmp_path: Path) -> None:
    """One bundle per record read (``records_per_call=1``): over a thousand bundles of the read
    stage. Beam 2.77's FnApiRunner nests one generator per bundle in the metrics it keeps, and
    reading them at the end failed with RecursionError (pipeline.jobs consolidates them after
    every bundle instead)."""
    url = f"local:{tmp_path / 'log'}"
    rollouts = [make_rollout(i, f"r{i}", calls=4) for i in range(150)]
    records = [rec for r in rollouts for rec in r.records]
    with open_writer(url) as writer:
        for rec in records:
            writer.append(EVENTS_TOPIC, rec.rollout_id.encode(), encode_message([rec]))
    assert len(records) > 1100

    report = run_streaming(
        url, Outputs(url), allowed_lateness_s=5, stop_when_idle_s=2, records_per_call=1
    )
    assert report.runner == "FnApiRunner"
    assert report.counters["log_records_read"] == len(records)
    assert report.counters["log_read_checkpoints"] >= len(records)


def test_the_in_process_quirks_are_for_streaming_jobs_only() -> None:
    """A replay (batch) on the default runner settles on the watermark, as on any runner, so a
    rollout with several rewards joins all of them (tests/openforge/replay/test_rescore.py
    rebuilds episodes from an archive holding a re-score's rewards beside the run's)."""
    from pipeline.jobs import RunnerQuirks, options, quirks

    streaming = quirks(options([], streaming=True))
    assert streaming.runner == "FnApiRunner" and streaming.emit_at_once
    assert streaming.defer_early_deadlines and streaming.records_per_call > 100_000
    assert quirks(options([], streaming=False)) == RunnerQuirks("FnApiRunner")
    assert quirks(options(["--runner=PrismRunner"], streaming=True)) == RunnerQuirks("PrismRunner")
