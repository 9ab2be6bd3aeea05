"""Event log URLs: kafka://HOST:PORT[,...], local:DIR and archive:DIR, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.eventlog import LogKind, LogUrl, open_reader, open_writer, parse_url
from schemas.errors import ConfigError

hosts = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
servers = st.lists(
    st.builds(lambda h, p: f"{h}:{p}", hosts, st.integers(1, 65535)), min_size=1, max_size=4
)
directories = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1
)


@pytest.mark.parametrize(
    ("url", "kind", "where"),
    [
        ("kafka://127.0.0.1:9092", LogKind.KAFKA, "127.0.0.1:9092"),
        ("kafka://a:1,b:2/", LogKind.KAFKA, "a:1,b:2"),
        ("kafka://broker", LogKind.KAFKA, "broker"),  # kafka-python's default port
        ("local:events", LogKind.LOCAL, "events"),
        ("local:///var/log/of", LogKind.LOCAL, "/var/log/of"),
        ("local://rel/dir", LogKind.LOCAL, "rel/dir"),
        ("archive:/data/archive", LogKind.ARCHIVE, "/data/archive"),
        ("archive://out", LogKind.ARCHIVE, "out"),
    ],
)
def test_known_urls(url: str, kind: LogKind, where: str) -> None:
    parsed = parse_url(url)
    assert (parsed.kind, parsed.where) == (kind, where)
    assert parse_url(str(parsed)) == parsed


@pytest.mark.parametrize(
    "url",
    ["", "kafka://", "kafka:///", "kafka://a:1,,b:2", "kafka://a:0", "kafka://a:99999",
     "kafka://a:x", "kafka://:9092", "kafka://u@h:1", "local:", "local://", "archive:",
     "file:/tmp/x", "Kafka://a:1", "/tmp/log", "local:a\0b", "kafka://a:1?partitions=0",
     "kafka://a:1?partitions=x", "kafka://a:1?parts=2", "kafka://a:1?partitions=99999"],
)  # fmt: skip
def test_bad_urls_say_what_to_use(url: str) -> None:
    with pytest.raises(ConfigError, match=r"kafka://HOST:PORT|port|Kafka server|partitions"):
        parse_url(url)


def test_the_parts() -> None:
    assert parse_url("kafka://a:1,b:2").servers == ["a:1", "b:2"]
    assert parse_url("local:x/y").path == Path("x/y")
    assert parse_url("archive:x").servers == []
    with pytest.raises(ConfigError, match="not a directory"):
        _ = parse_url("kafka://a:1").path


def test_an_archive_is_not_an_event_log(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Parquet archive, not an event log"):
        open_writer(f"archive:{tmp_path}")
    with pytest.raises(ConfigError, match="Parquet archive, not an event log"):
        open_reader(f"archive:{tmp_path}", ["t"], group="g")


@given(servers, st.one_of(st.none(), st.integers(1, 1024)))
def test_kafka_urls_round_trip(given_servers: list[str], partitions: int | None) -> None:
    query = "" if partitions is None else f"?partitions={partitions}"
    parsed = parse_url("kafka://" + ",".join(given_servers) + query)
    assert parsed == LogUrl(LogKind.KAFKA, ",".join(given_servers), partitions or 1)
    assert parsed.servers == given_servers
    assert parse_url(str(parsed)) == parsed


@given(st.sampled_from([LogKind.LOCAL, LogKind.ARCHIVE]), directories)
def test_directory_urls_round_trip(kind: LogKind, directory: str) -> None:
    parsed = LogUrl(kind, directory)
    assert parse_url(str(parsed)) == parsed
    if not directory.startswith("//"):
        assert parse_url(f"{kind}:{directory}") == parsed


@given(st.text())
def test_any_text_parses_or_is_a_config_error(text: str) -> None:
    try:
        parsed = parse_url(text)
    except ConfigError:
        return
    assert parse_url(str(parsed)) == parsed
    assert parsed.where
