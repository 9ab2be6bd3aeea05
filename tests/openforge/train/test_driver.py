"""The rollout driver's guard: an update whose rollouts all failed for infrastructure reasons
can get no batch, and the run says so instead of waiting for it forever."""

from __future__ import annotations

import threading

import pytest

from openforge.train.driver import _check_round
from orchestrator.rundir import RolloutOutcome, Status
from schemas.errors import InfrastructureError


def _outcome(i: int, status: Status, message: str = "") -> RolloutOutcome:
    return RolloutOutcome(f"r-{i}", "task-a", "g", i, 3, status, message=message)


def test_a_round_with_no_verified_rollout_fails_with_their_reasons() -> None:
    failed = [
        _outcome(i, Status.INFRA_FAILED, "sandbox did not start: out of memory") for i in (0, 1)
    ]
    with pytest.raises(InfrastructureError, match="none of the 2 rollouts of update 3") as err:
        _check_round(3, failed, threading.Event())
    assert "sandbox did not start: out of memory" in str(err.value)


def test_one_verified_rollout_or_a_stop_lets_the_round_pass() -> None:
    mixed = [_outcome(0, Status.INFRA_FAILED, "x"), _outcome(1, Status.VERIFIED)]
    _check_round(1, mixed, threading.Event())  # the trainer can still form a batch
    stopped = threading.Event()
    stopped.set()  # cancelled by a stop: the run is ending anyway
    _check_round(1, [_outcome(0, Status.CANCELLED)], stopped)
