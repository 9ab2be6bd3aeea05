"""Settings: modes are enums, converted from strings and checked when the config is built."""

from __future__ import annotations

import pytest

from proxy.config import PauseMode, ProxyConfig, UpstreamKind
from proxy.upstream import UPSTREAMS
from schemas.errors import ConfigError


def test_mode_strings_become_enums() -> None:
    config = ProxyConfig("http://x", upstream_kind="generate", pause_mode="reject")
    assert config.upstream_kind is UpstreamKind.GENERATE
    assert config.pause_mode is PauseMode.REJECT
    assert ProxyConfig("http://x").upstream_kind is UpstreamKind.COMPLETIONS


@pytest.mark.parametrize(
    ("field", "typo", "choices"),
    [
        ("upstream_kind", "genrate", "completions, generate"),
        ("pause_mode", "rejct", "wait, reject"),
    ],
)
def test_a_mode_typo_is_a_config_error_naming_the_choices(
    field: str, typo: str, choices: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ProxyConfig("http://x", **{field: typo})  # type: ignore[arg-type]
    assert str(info.value) == f"unknown {field} '{typo}': choose one of {choices}"


def test_every_upstream_kind_has_an_upstream() -> None:
    assert UPSTREAMS.names() == sorted(kind.value for kind in UpstreamKind)
    with pytest.raises(ConfigError, match="choose one of completions, generate"):
        UPSTREAMS.get("grpc")
