"""Session fixtures that start the real local services, and the suite's leftover-process check.

Services start lazily: a test run that needs no broker starts none.

The suite runs on two pytest-xdist workers (``-n 2`` in pyproject.toml), each a session of its
own with its own services. A machine has one kubelet (it owns kube-router's firewall chains and
the CRI's network namespaces), so the modules that start a real node, the README's blocks among
them (they also share ``runs/`` and ports 8100 and 8200, in order), are one unit of work that
one worker runs whole, in order (:func:`pytest_xdist_make_scheduler`); every other test is a
unit of its own. ``-n 0`` runs everything in one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from infra.local.kafka import KafkaBroker
from infra.local.kube import LocalKube
from infra.local.process import kill_tagged, leftover_processes
from infra.local.vllm import VLLMServer
from infra.paths import cache_dir, default_tiny_dir
from infra.tiny_model import TinyModelSpec, build_tiny_model
from infra.tiny_vlm import build_tiny_vlm

TINY_SEED = 0

# Property tests check properties, not speed (that is bench/'s): no per-example deadline, and no
# health check that times the data generation, whatever else runs beside them.
settings.register_profile("openforge", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("openforge")

# Test modules that start a real kubelet node (tests/test_suite.py finds them).
REAL_NODE_MODULES = frozenset({
    "tests/infra/k8s/test_serve_on_a_node.py",
    "tests/infra/local/test_kube_node.py",
    "tests/openforge/test_tasks_cli.py",
    "tests/openforge/train/test_run.py",
    "tests/orchestrator/test_backend_contract.py",
    "tests/orchestrator/test_kube_real_node.py",
    "tests/readme/test_readme.py",
})  # fmt: skip


# Test modules that serve the tiny VLM (one worker starts its vLLM server for all of them).
VLM_MODULES = frozenset({
    "tests/infra/test_tiny_vlm.py",
    "tests/proxy/test_images_engine.py",
    "tests/orchestrator/test_web_tasks_vlm.py",
    "tests/trainer/test_cpu_vlm.py",
})  # fmt: skip


# Test modules whose module-scoped fixture is one long run into a fixed directory: the whole
# module goes to one worker (split over two, each worker made the run again, into the same
# directory, and the two clobbered each other past the module's timeout).
WHOLE_MODULES = frozenset({
    "tests/openforge/train/test_real_harness_runs.py",
    "tests/openforge/train/test_recovery_run.py",
})  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with one scope for :data:`REAL_NODE_MODULES`, one for
    :data:`VLM_MODULES`, one per module of :data:`WHOLE_MODULES` and one per test elsewhere
    (xdist's own ``loadgroup`` cannot group under pytest 9: it renames a private attribute
    pytest 9 no longer reads). The largest scope is sent first."""
    from xdist.scheduler import LoadScopeScheduling

    class RealNodeTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in REAL_NODE_MODULES:
                return "real-node"
            if module in WHOLE_MODULES:
                return module
            return "vlm" if module in VLM_MODULES else nodeid

    return RealNodeTogether(config, log)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, built once per session (cached across sessions under the cache dir)."""
    from infra.paths import default_tiny_dir

    return build_tiny_model(default_tiny_dir(TINY_SEED), seed=TINY_SEED)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def local_kube() -> Iterator[LocalKube]:
    """A real control plane (etcd, API server, controller-manager, scheduler) with kwok nodes."""
    with LocalKube() as kube:
        yield kube


@pytest.fixture(scope="module")
def real_kube() -> Iterator[LocalKube]:
    """A real control plane with one real node (the kubelet on containerd and runc) and no kwok
    node: its pods' containers really run. Per module: the node's kubelet is not left running
    beside the rest of the suite."""
    with LocalKube(nodes=0, real_nodes=1) as kube:
        yield kube


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path) -> Iterator[VLLMServer]:
    with VLLMServer(tiny_model_dir, served_model_name="tiny") as server:
        yield server


@pytest.fixture(scope="session")
def tiny_vlm_dir(tiny_model_dir: Path) -> Path:
    """The tiny VLM over the tiny model's tokenizer, built once (cached under the cache dir)."""
    return build_tiny_vlm(cache_dir() / "models" / f"tiny-vlm-seed{TINY_SEED}", tiny_model_dir)


@pytest.fixture(scope="session")
def vlm_server(tiny_vlm_dir: Path) -> Iterator[VLLMServer]:
    """vLLM on CPU serving the tiny VLM, up to eight images a prompt."""
    extra = ["--limit-mm-per-prompt", '{"image": 8}']
    with VLLMServer(
        tiny_vlm_dir, served_model_name="tiny-vlm", enable_lora=False, extra_args=extra
    ) as server:
        yield server


LONG_CONTEXT = 65536


@pytest.fixture(scope="session")
def long_model_dir() -> Path:
    """The tiny model (same seed, same weights) with a 64k-token context."""
    spec = TinyModelSpec(max_position_embeddings=LONG_CONTEXT)
    return build_tiny_model(default_tiny_dir(TINY_SEED, LONG_CONTEXT), seed=TINY_SEED, spec=spec)


@pytest.fixture(scope="package")
def long_vllm(long_model_dir: Path) -> Iterator[VLLMServer]:
    """A vLLM for real harnesses: their own system prompts and tool lists are 17k-31k tokens
    with the tiny model's tokenizer, past the suite's 4096-token server. Per test package that
    asks for it."""
    with VLLMServer(
        long_model_dir, served_model_name="tiny", max_model_len=LONG_CONTEXT, enable_lora=False
    ) as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail the session (each worker's) if any service process outlived its fixture, and clean
    it up. Set up first, so torn down last: after every other session fixture's services."""
    yield
    left = leftover_processes(os.getpid())
    if left:
        kill_tagged(f"{os.getpid()}.")
        pytest.fail(f"service processes left running after the suite: {left}")
