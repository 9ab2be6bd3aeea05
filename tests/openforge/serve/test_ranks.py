"""The services apart with the trainer under torchrun: two ranks of veRL's FSDP engine (gloo on
CPU) training a LoRA adapter from live traffic on a 4-partition Kafka log. Rank 0 reads the
stream and hot-loads each update into vLLM; both ranks update and checkpoint. The trainer is
SIGKILLed (torchrun and both ranks) after its second update and started again: it resumes from
its two-rank checkpoint and its consumer group's offsets, so nothing is trained twice, and the
served policy version keeps advancing."""

from __future__ import annotations

import json
import threading
from functools import partial
from pathlib import Path

from infra.local.kafka import KafkaBroker
from infra.local.vllm import VLLMServer
from openforge.serve.apart import Service, services_apart
from openforge.traffic.ledger import ledger
from openforge.traffic.simulate import TrafficReport
from tests.openforge.serve.live import (
    apart_config,
    at_least,
    served_latest,
    traffic,
    until,
    warm_up,
)
from trainer.backends import BackendName


def test_a_two_rank_trainer_trains_the_served_policy_and_resumes_after_a_kill(
    vllm_server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "serve"
    with KafkaBroker(data_dir=tmp_path / "kafka") as broker:
        url = f"kafka://{broker.bootstrap}?partitions=4"
        config = apart_config(
            url, vllm_server, tiny_model_dir, out,
            trainer_backend=BackendName.VERL, trainer_ranks=2,
        )  # fmt: skip
        with services_apart(config) as services:
            warm_up(vllm_server)
            stop, result = threading.Event(), dict[str, TrafficReport]()
            thread = traffic(services, stop, result)
            try:
                until("2 updates", partial(at_least, out, 2), services, timeout=300)
                before_kill = services.policy_version()
                services.kill(Service.TRAINER)
                services.start(Service.TRAINER)
                until("4 updates", partial(at_least, out, 4), services, timeout=300)
            finally:
                stop.set()
                thread.join(timeout=180)
            served = served_latest(services, out)
        book = ledger(url, result["report"], out / "trainer")

    assert book.lost == 0 and book.trained_twice == 0, book
    assert book.recorded == book.served, book
    trainer = out / "trainer"
    versions = [json.loads(line)["version"] for line in
                (trainer / "versions.jsonl").read_text().splitlines()]  # fmt: skip
    assert versions == sorted(set(versions)) and served == versions[-1] > before_kill >= 2
    latest = trainer / "checkpoints" / (trainer / "checkpoints" / "LATEST").read_text()
    shards = sorted(p.name for p in (latest / "verl").glob("model_world_size_2_rank_*.pt"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    logs = sorted((out / "logs").glob("trainer-*.log"))
    assert len(logs) == 2 and "resumed from the checkpoint" in logs[1].read_text(), logs
