"""Help texts list the names their registries and enums define (issue 52): a harness, backend
or mode added to its registry shows up in ``--help`` without anyone editing the text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.harnesses import HARNESSES
from openforge.traffic.harness_users import HARNESS_USERS
from orchestrator.environments import SandboxMode
from orchestrator.registry import ROLLOUT_BACKENDS
from trainer.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[3]


def _help(*command: str) -> str:
    """``openforge COMMAND --help`` as a user runs it, on a terminal wide enough not to wrap."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-m", "openforge", *command, "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


@pytest.mark.parametrize(
    ("command", "names"),
    [
        (("rollouts", "run"), HARNESSES.names()),
        (("rollouts", "run"), ROLLOUT_BACKENDS.names()),
        (("rollouts", "run"), [m.value for m in SandboxMode]),
        (("rollout", "run"), HARNESSES.names()),
        (("train",), HARNESSES.names()),
        (("traffic",), list(HARNESS_USERS)),
        (("serve",), BACKENDS.names()),
        (("replay", "train"), BACKENDS.names()),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else None,
)
def test_every_registered_name_is_in_the_help(command: tuple[str, ...], names: list[str]) -> None:
    text = _help(*command)
    missing = [n for n in names if n not in text]
    assert not missing, f"`openforge {' '.join(command)} --help` does not name {missing}"
