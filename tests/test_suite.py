"""The suite's own arrangement: every module that starts a real kubelet node is in the one
unit of work that one xdist worker runs (tests/conftest.py), and that list names no module
that does not exist; likewise the modules that serve the tiny VLM."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REAL_NODE_MODULES, VLM_MODULES

ROOT = Path(__file__).resolve().parents[1]
# What starts a real node: the module fixture, LocalKube's argument, the train config's backend,
# `services up --kube` (the manual's blocks, docs/kubernetes.md: tests/readme runs them).
STARTS_A_NODE = re.compile(
    r"\breal_kube\b|real_nodes=1|rollouts\.backend=kubernetes|services up --kube"
)


def test_every_module_that_starts_a_real_node_runs_in_the_real_node_unit() -> None:
    starting = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_suite.py" and STARTS_A_NODE.search(p.read_text())
    }
    starting.add("tests/readme/test_readme.py")
    assert starting == REAL_NODE_MODULES, sorted(starting ^ REAL_NODE_MODULES)
    assert "services up --kube" in (ROOT / "docs" / "kubernetes.md").read_text()
    assert all((ROOT / m).is_file() for m in REAL_NODE_MODULES)


def test_every_module_that_serves_the_tiny_vlm_runs_in_the_vlm_unit() -> None:
    serving = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_suite.py" and re.search(r"\bvlm_server\b", p.read_text())
    }
    assert serving == VLM_MODULES, sorted(serving ^ VLM_MODULES)


def test_a_module_whose_fixture_is_one_run_into_a_fixed_directory_runs_on_one_worker() -> None:
    """Its tests split over both workers made the run twice, into the same directory."""
    from tests.conftest import WHOLE_MODULES

    fixed = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r'^OUT = Path\("runs"\)', p.read_text(), flags=re.M)
    }
    assert fixed and fixed <= WHOLE_MODULES, sorted(fixed - WHOLE_MODULES)
