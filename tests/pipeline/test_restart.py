"""The streaming job's process group SIGKILLed mid-stream, more events written, the job started
again on the same log: every episode (and dead letter) is in its topic exactly once, as replay
builds it. The restarted job reads the log from the start; the sink writes only what the topic
does not hold yet."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, open_writer
from infra.local.process import ServiceProcess
from openforge.testing.rollouts import Rollout, make_rollout
from pipeline.assembly import assemble
from pipeline.sinks import episodes_in
from schemas.codec import encode_message
from schemas.episode import Episode


def _append(url: str, rollouts: list[Rollout]) -> None:
    with open_writer(url) as writer:
        for r in rollouts:
            for rec in r.records:
                writer.append(EVENTS_TOPIC, r.rollout_id.encode(), encode_message([rec]))


def _episodes(url: str, topic: str) -> list[Episode]:
    return list(episodes_in(url, topic))


def _job(url: str, tmp: Path, name: str, *extra: str) -> ServiceProcess:
    argv = [
        sys.executable, "-m", "openforge", "pipeline", "run", "--source", url,
        "--lateness", "3", *extra,
    ]  # fmt: skip
    job = ServiceProcess(name, argv, tmp / f"{name}.log")
    job.start()
    return job


def test_a_job_killed_mid_stream_and_restarted_writes_every_episode_once(tmp_path: Path) -> None:
    url = f"local:{tmp_path / 'log'}"
    rollouts = [make_rollout(i, f"r{i}", calls=6, with_reward=i % 7 != 3) for i in range(24)]
    _append(url, rollouts[:12])
    first = _job(url, tmp_path, "pipeline-1")
    try:
        deadline = time.monotonic() + 180
        while len(_episodes(url, EPISODES_TOPIC)) < 4:
            first.check_alive()
            assert time.monotonic() < deadline, "the first job wrote no episodes"
            time.sleep(0.2)
        pid = first.pid
        assert pid is not None
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the job and its runner, mid-stream
    finally:
        first.stop()
    before = len(_episodes(url, EPISODES_TOPIC))
    _append(url, rollouts[12:])
    second = _job(url, tmp_path, "pipeline-2", "--stop-when-idle", "8")
    try:
        deadline = time.monotonic() + 300
        while second.poll() is None:
            assert time.monotonic() < deadline, "the restarted job did not finish"
            time.sleep(0.5)
        assert second.poll() == 0, (tmp_path / "pipeline-2.log").read_text()[-3000:]
    finally:
        second.stop()

    streamed = _episodes(url, EPISODES_TOPIC) + _episodes(url, DEAD_LETTER_TOPIC)
    ids = [e.rollout_id for e in streamed]
    print(f"restart: {before} episodes before the kill, {len(streamed)} in the topics after")
    assert sorted(ids) == sorted(r.rollout_id for r in rollouts)  # each exactly once
    for episode in streamed:
        rollout = next(r for r in rollouts if r.rollout_id == episode.rollout_id)
        replayed = assemble(rollout.rollout_id, rollout.records, created_us=0)
        assert [s.token_ids for s in episode.samples] == [s.token_ids for s in replayed.samples]
        rewarded = int(rollout.rollout_id[1:]) % 7 != 3
        assert (episode.dead_letter is None) == rewarded, episode.dead_letter
        assert episode.reward == (rollout.reward if rewarded else None)
