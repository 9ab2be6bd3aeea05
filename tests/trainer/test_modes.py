"""Modes are enums checked when a config is built: a typo fails at start-up with the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.errors import ConfigError
from trainer.algorithm_names import AdvantageEstimator, PolicyLoss
from trainer.algorithms import AlgorithmConfig
from trainer.backends import BackendName
from trainer.loop import TrainerConfig
from trainer.stream import StalePolicy, StreamConfig
from trainer.weight_sync import SyncMode, WeightSync


def test_names_become_enum_members() -> None:
    assert StreamConfig(stale="keep").stale is StalePolicy.KEEP  # type: ignore[arg-type]
    assert WeightSync("http://127.0.0.1:1", mode="full").mode is SyncMode.FULL  # type: ignore[arg-type]
    cfg = TrainerConfig("local:x", Path("m"), Path("o"), backend="verl")  # type: ignore[arg-type]
    assert cfg.backend is BackendName.VERL
    algo = AlgorithmConfig(advantage="rloo", policy_loss="gspo")  # type: ignore[arg-type]
    assert algo.advantage is AdvantageEstimator.RLOO and algo.policy_loss is PolicyLoss.GSPO


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
        (
            lambda: AlgorithmConfig(advantage="gae"),
            "unknown advantage estimator 'gae': choose one of grpo, grpo_vectorized, gdpo",
        ),
        (
            lambda: AlgorithmConfig(policy_loss="dro"),
            "unknown policy loss 'dro': choose one of vanilla, bypass_mode, cispo",
        ),
        (
            lambda: TrainerConfig("local:x", Path("m"), Path("o"), checkpoint_every=0),
            "checkpoint_every must be at least 1, not 0",
        ),
    ],
)
def test_a_typo_is_a_config_error_naming_the_choices(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]


def test_the_trainer_cli_refuses_a_bad_algorithm_name_before_it_starts() -> None:
    from typer.testing import CliRunner

    from openforge.cli import app

    argv = ["trainer", "run", "--episodes", "local:x", "--model", "m", "--advantage", "gae"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2  # a usage error: nothing was started
    assert "'gae' is not one of" in result.output and "'rloo'" in result.output
    argv[-2:] = ["--policy-loss", "dro"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "'gspo'" in result.output
