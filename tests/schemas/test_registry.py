"""The one registry style: lookups by name, a bad name listing the valid ones."""

from __future__ import annotations

from enum import StrEnum

import pytest

from schemas.errors import ConfigError
from schemas.registry import Registry


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


def test_lookup_by_enum_or_string_and_a_bad_name_lists_the_valid_ones() -> None:
    reg: Registry[int] = Registry("colour")
    reg.add(Colour.RED, 1)

    @reg.register(Colour.BLUE)
    def _blue() -> int:
        return 2

    assert reg.get(Colour.RED) == 1 and reg["red"] == 1
    assert reg.get("blue") is _blue
    assert list(reg) == ["blue", "red"] and len(reg) == 2 and "red" in reg
    with pytest.raises(ConfigError, match=r"unknown colour 'green': choose one of blue, red"):
        reg.get("green")


def test_a_name_registered_twice_is_refused() -> None:
    reg: Registry[int] = Registry("colour")
    reg.add("red", 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("red", 2)


def test_every_registry_of_the_project_refuses_a_typo_with_the_choices() -> None:
    from infra.harnesses import HARNESSES
    from trainer.backends import BACKENDS

    for registry, valid in (
        (
            HARNESSES,
            "agent, browser, browser-anthropic, claude-code, codex, noop, openclaw, opencode, "
            "oracle, qwen-code",
        ),
        (BACKENDS, "cpu, verl"),
    ):
        with pytest.raises(ConfigError, match=f"choose one of {valid}"):
            registry.get("typo")
