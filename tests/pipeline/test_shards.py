"""Several streaming jobs on one log (pipeline.shards): ``--worker I/N`` jobs read disjoint
partitions that together are all of them; two real jobs (``openforge pipeline run --worker 0/2``
and ``1/2``) on a 4-partition Kafka log assemble every rollout exactly once between them, each
its own half; bad shards are refused before anything starts."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, create_topics
from infra.local.kafka import KafkaBroker
from infra.local.process import ServiceProcess
from openforge.testing.rollouts import make_rollout
from pipeline.shards import Shard
from schemas.errors import ConfigError
from tests.pipeline.test_restart import _append, _episodes


@given(st.integers(1, 8), st.integers(1, 24))
def test_the_shards_of_a_topic_are_disjoint_and_cover_it(count: int, n: int) -> None:
    parts = list(range(n))
    if n < count:
        with pytest.raises(ConfigError, match="no partition"):
            Shard(count - 1, count).mine(parts, "t")
        return
    shares = [Shard(i, count).mine(parts, "t") for i in range(count)]
    assert sorted(p for share in shares for p in share) == parts
    assert all(shares)


@pytest.mark.parametrize("text", ["2/2", "-1/2", "1", "a/b", "0/0"])
def test_a_bad_worker_is_refused_saying_how_to_write_one(text: str) -> None:
    with pytest.raises(ConfigError, match="worker"):
        Shard.parse(text)
    cli = [sys.executable, "-m", "openforge", "pipeline", "run", "--source", "local:x"]
    done = subprocess.run([*cli, "--worker", text], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "worker" in done.stderr and "Traceback" not in done.stderr


def test_two_jobs_on_four_partitions_assemble_each_rollout_once(tmp_path: Path) -> None:
    rollouts = [make_rollout(i, f"r{i}", calls=3, with_reward=i % 5 != 2) for i in range(24)]
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}?partitions=4"
        create_topics(url, [EVENTS_TOPIC])
        _append(url, rollouts)
        jobs = [_job(url, tmp_path, i) for i in range(2)]
        try:
            deadline = time.monotonic() + 300
            while any(job.poll() is None for job in jobs):
                assert time.monotonic() < deadline, "the two jobs did not finish"
                time.sleep(0.5)
            codes = [job.poll() for job in jobs]
        finally:
            for job in jobs:
                job.stop()
        logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
        assert codes == [0, 0], [log[-2000:] for log in logs]
        streamed = _episodes(url, EPISODES_TOPIC) + _episodes(url, DEAD_LETTER_TOPIC)
    assert Counter(e.rollout_id for e in streamed) == Counter(r.rollout_id for r in rollouts)
    made = []
    for i, log in enumerate(logs):
        line = re.search(rf"pipeline run \(streaming, worker {i}/2\).*", log)
        assert line is not None, log[-2000:]
        counts = dict(re.findall(r"(episodes_emitted|dead_letters) (\d+)", line[0]))
        made.append(sum(int(v) for v in counts.values()))
    assert all(made) and sum(made) == len(rollouts), made  # each its own share, none twice


def _job(url: str, tmp: Path, index: int) -> ServiceProcess:
    argv = [
        sys.executable, "-m", "openforge", "pipeline", "run", "--source", url,
        "--lateness", "3", "--stop-when-idle", "8", "--worker", f"{index}/2",
    ]  # fmt: skip
    job = ServiceProcess(f"worker-{index}", argv, tmp / f"worker-{index}.log")
    job.start()
    return job
