"""The ``step`` record (a trainer update's lineage): round trips through the archive, its
partition date, NaN metrics, and values that do not fit refused clearly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.archive import ArchiveWriter, archive_files, partition_date, read_archive
from schemas.codec import REGISTRY, decode_message, encode_message, record_type
from schemas.errors import SchemaError
from schemas.step import ConsumedEpisode, TrainingStep
from tests.schemas.strategies import steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(steps, min_size=1, max_size=5))
def test_steps_written_durably_are_read_back_in_their_date_partitions(
    tmp_path_factory: pytest.TempPathFactory, records: list[TrainingStep]
) -> None:
    root = tmp_path_factory.mktemp("archive")
    written = ArchiveWriter(root, durable=True).write(records)
    assert {p.parent.name for p in written} == {f"date={partition_date(r.at_us)}" for r in records}
    assert sorted(archive_files(root, "step")) == sorted(written)
    assert sorted(read_archive(root, TrainingStep), key=repr) == sorted(records, key=repr)
    assert not list(root.rglob("*.tmp"))  # nothing half-written is left behind


def test_the_step_record_is_registered_with_its_own_wire_id() -> None:
    rtype = record_type(TrainingStep)
    assert REGISTRY["step"] is rtype and rtype.name == TrainingStep.SCHEMA_NAME
    assert len({t.type_id for t in REGISTRY.values()}) == len(REGISTRY)


def test_a_nan_metric_stays_nan_and_an_offset_past_int32_partitions_is_refused(
    tmp_path: Path,
) -> None:
    episode = ConsumedEpisode("e1", "r1", policy_versions=[0, 1], topic="t", partition=0, offset=7)
    record = TrainingStep(3, 1_700_000_000_000_000, 3, [episode], {"actor/kl": math.nan})
    (back,) = decode_message(encode_message([record]))
    assert isinstance(back, TrainingStep) and math.isnan(back.metrics["actor/kl"])
    assert back.episodes == [episode]
    bad = TrainingStep(1, 0, 1, [ConsumedEpisode("e", "r", partition=2**31)])
    with pytest.raises(SchemaError, match="does not fit its schema"):
        ArchiveWriter(tmp_path).write([bad])
