"""Modes are enums checked when a config is built: a typo fails at start-up with the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.errors import ConfigError
from trainer.backends import BackendName
from trainer.loop import TrainerConfig
from trainer.stream import StalePolicy, StreamConfig
from trainer.weight_sync import SyncMode, WeightSync


def test_names_become_enum_members() -> None:
    assert StreamConfig(stale="keep").stale is StalePolicy.KEEP  # type: ignore[arg-type]
    assert WeightSync("http://127.0.0.1:1", mode="full").mode is SyncMode.FULL  # type: ignore[arg-type]
    cfg = TrainerConfig("local:x", Path("m"), Path("o"), backend="verl")  # type: ignore[arg-type]
    assert cfg.backend is BackendName.VERL


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: StreamConfig(stale="dorp"),
            "unknown stale policy 'dorp': choose one of drop, keep",
        ),
        (
            lambda: WeightSync("http://127.0.0.1:1", mode="ful"),
            "unknown weight-sync mode 'ful': choose one of lora, full",
        ),
        (
            lambda: TrainerConfig("local:x", Path("m"), Path("o"), backend="vrl"),
            "unknown trainer backend 'vrl': choose one of cpu, verl",
        ),
    ],
)
def test_a_typo_is_a_config_error_naming_the_choices(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]
