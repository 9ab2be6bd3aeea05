"""The rollout-backend contract (:mod:`orchestrator.backend`): the same cases over every backend.

Each backend is built as the command line builds it (its config section, by name, through the
registry, with a real proxy) and plays the oracle on a task whose solution exits with the case's
code and whose verifier writes the case's reward. Both run for real: the local backend in
bubblewrap sandboxes, the Kubernetes backend as pods of the local cluster's real node (the
kubelet on containerd and runc), in a local image imported into the node. A backend added later
(its name in :class:`~orchestrator.backend.RolloutBackendName`) joins the parametrisation.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infra.harnesses import Agent, Oracle
from infra.local.process import processes_of
from infra.sandbox import ProxyEndpoint
from infra.tasks import Task, load_task
from openforge.testing.proxy import RunningProxy, proxy_config, running_proxy
from orchestrator import final_workspace
from orchestrator.backend import (
    AgentEnd,
    RolloutBackend,
    RolloutBackendName,
    RolloutJob,
    RunProxy,
    Verified,
)
from orchestrator.kube_pod import PodSettings
from orchestrator.kubernetes import KubeOptions, KubernetesBackend
from orchestrator.registry import RolloutBackendConfig, build_backend
from schemas.enums import RolloutPhase
from schemas.errors import ConfigError, InfrastructureError, SetupError

NS = "openforge-rollouts"
IMAGE = "localhost/python:3.11-slim"  # a task without an image runs in this one on the node


@dataclass(frozen=True)
class Play:
    """How a case's rollout goes: the agent's exit code (None: it never ends by itself) and the
    text of the reward file the verifier writes (None: it writes none)."""

    exit_code: int | None = 0
    reward: str | None = "1"


def _task(root: Path, play: Play, solution: bool = True) -> Task:
    (root / "tests").mkdir(parents=True)
    (root / "instruction.md").write_text("Play the case.\n")
    (root / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 30\n'
        '[environment]\nworkdir = "/app"\n'
    )
    write = "true" if play.reward is None else f"echo {play.reward} > /logs/verifier/reward.txt"
    # The verifier's own writes are not in the final workspace (it is saved before them).
    (root / "tests" / "test.sh").write_text(f"#!/bin/bash\necho v > by-verifier.txt\n{write}\n")
    if solution:
        (root / "solution").mkdir()
        solve = "sleep 1000" if play.exit_code is None else f"exit {play.exit_code}"
        solve = f"mkdir -p out && echo {play.exit_code} > out/made-by-agent.txt\n{solve}"
        (root / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    return load_task(root)


@dataclass
class Contract:
    """One backend under the contract: builds it for a case, plays a rollout on it."""

    name: RolloutBackendName
    proxy: RunningProxy
    tmp: Path
    kube: Any = None  # the LocalKube, for the Kubernetes backend
    made: list[RolloutBackend] = field(default_factory=list)

    def backend(self, play: Play) -> RolloutBackend:
        assert self.proxy.unix_socket is not None
        kubeconfig = self.kube.kubeconfig if self.kube is not None else None
        sink = self.kube.real_node.sink.url if self.kube is not None else None
        # No harness image: a task with none of its own runs in the catalogue's python base,
        # with the harness's install added, published to the node (orchestrator/kube_images.py).
        pod = PodSettings(namespace=NS, proxy_url=self.proxy.url)
        options = KubeOptions(kubeconfig=kubeconfig, pod=pod, image_sink=sink)
        config = RolloutBackendConfig(name=self.name, kubernetes=options)
        run_proxy = RunProxy(self.proxy.url, ProxyEndpoint(self.proxy.unix_socket, 8100))
        backend = build_backend(config, run_proxy)
        self.made.append(backend)
        assert backend.name is self.name
        return backend

    def job(self, task: Task, case: str) -> RolloutJob:
        rollout_id = f"contract-{self.name}-{case}"  # one proxy for the module: ids of its own
        key = self.proxy.admin.register_rollout(rollout_id, task_id=task.id).api_key or ""
        return RolloutJob(rollout_id, task, Oracle(), key, "tiny", self.tmp / "run" / rollout_id)

    def running(self, backend: RolloutBackend) -> list[str]:
        """What of the backend's rollouts runs now: sandbox processes, or pods."""
        if not isinstance(backend, KubernetesBackend):
            return [str(p) for p in processes_of(f"{os.getpid()}.sandbox.")]
        pods = backend.core.list_namespaced_pod(NS, label_selector=backend.selector)
        return [p.metadata.name for p in pods.items]

    def started(self, backend: RolloutBackend) -> bool:
        """The rollout's agent runs: its pod is there, or its sandbox's init and the agent."""
        return len(self.running(backend)) >= (1 if self.kube is not None else 2)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("contract-proxy")
    config = proxy_config("http://127.0.0.1:9", tmp, tokenizer=tiny_model_dir,
                          max_model_len=4096, upstream_model="tiny")  # fmt: skip
    with running_proxy(config, unix_socket=tmp / "proxy.sock") as running:
        yield running


@pytest.fixture(params=list(RolloutBackendName))
def contract(
    request: pytest.FixtureRequest, proxy: RunningProxy, tmp_path: Path
) -> Iterator[Contract]:
    kube = None
    if request.param is RolloutBackendName.KUBERNETES:
        from kubernetes import client

        kube = request.getfixturevalue("real_kube")
        core = client.CoreV1Api(kube.api())
        if not any(n.metadata.name == NS for n in core.list_namespace().items):
            core.create_namespace({"metadata": {"name": NS}})
            kube.real_node.load_image(IMAGE)
    case = Contract(request.param, proxy, tmp_path, kube)
    try:
        yield case
    finally:
        for backend in case.made:
            backend.close()


def _play(contract: Contract, play: Play, case: str) -> tuple[Verified | Exception, list[AgentEnd]]:
    backend = contract.backend(play)
    task = _task(contract.tmp / "task", play)
    assert backend.check(task, Oracle()) is not None
    backend.preflight(Oracle())
    ended: list[AgentEnd] = []
    try:
        return backend.run(contract.job(task, case), ended.append), ended
    except InfrastructureError as exc:
        return exc, ended


def test_a_rollout_is_verified_and_its_agent_end_reported(
    contract: Contract, tmp_path: Path
) -> None:
    tmp = tmp_path / "restored"
    tmp.mkdir()
    verified, ended = _play(contract, Play(exit_code=0, reward="1"), "ok")
    assert isinstance(verified, Verified), verified
    assert verified.agent.phase is RolloutPhase.FINISHED and verified.agent.exit_code == 0
    assert verified.reward.reward == 1.0 and verified.verifier_exit_code == 0
    assert verified.agent.duration_s >= 0 and verified.verifier_duration_s >= 0
    assert ended == [verified.agent]  # reported once, as soon as it was known
    assert all(path.exists() for path in verified.files.values())
    assert verified.verifier_output is None or isinstance(verified.verifier_output, str)
    # The final workspace is kept as the agent left it, for re-scoring.
    final_workspace.restore(contract.tmp / "run" / f"contract-{contract.name}-ok", tmp)
    assert (tmp / "out" / "made-by-agent.txt").read_text() == "0\n"
    assert not (tmp / "by-verifier.txt").exists()


def test_an_agent_failure_is_its_result_and_still_verified(contract: Contract) -> None:
    verified, ended = _play(contract, Play(exit_code=3, reward="0"), "fails")
    assert isinstance(verified, Verified), verified
    assert verified.agent.phase is RolloutPhase.FAILED and verified.agent.exit_code == 3
    assert verified.reward.reward == 0.0 and ended == [verified.agent]


def test_a_verifier_without_a_reward_is_an_infrastructure_failure(contract: Contract) -> None:
    failed, ended = _play(contract, Play(exit_code=0, reward=None), "no-reward")
    assert isinstance(failed, InfrastructureError) and "gave no reward" in str(failed)
    assert [e.phase for e in ended] == [RolloutPhase.FINISHED]  # the agent's end came first


def test_what_no_attempt_can_pass_is_refused_before_any_rollout(
    contract: Contract, tmp_path: Path
) -> None:
    backend = contract.backend(Play())
    unsolved = _task(tmp_path / "unsolved", Play(), solution=False)
    with pytest.raises(ConfigError, match=r"no solution/solve\.sh"):
        backend.check(unsolved, Oracle())
    with pytest.raises(SetupError, match=r"cannot run .*no-python"):
        backend.preflight(Agent(python=tmp_path / "no-python"))
    assert contract.running(backend) == []


def test_it_says_where_a_rollout_of_a_task_runs(contract: Contract, tmp_path: Path) -> None:
    task = _task(tmp_path / "task", Play())  # no image of its own
    expected = {RolloutBackendName.LOCAL: "bubblewrap", RolloutBackendName.KUBERNETES: "pod"}
    assert contract.backend(Play()).runs_in(task) == expected[contract.name]


def test_cancel_stops_a_running_rollout_and_leaves_nothing(contract: Contract) -> None:
    play = Play(exit_code=None)  # the agent never ends by itself
    backend = contract.backend(play)
    job = contract.job(_task(contract.tmp / "task", play), "cancel")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            backend.run(job, lambda end: None)
        except BaseException as exc:
            raised.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 60
    while not contract.started(backend):
        assert time.monotonic() < deadline, "the rollout did not start"
        time.sleep(0.1)
    backend.cancel()
    runner.join(30)
    assert not runner.is_alive() and len(raised) == 1
    assert isinstance(raised[0], InfrastructureError), raised
    while contract.running(backend):
        assert time.monotonic() < deadline + 30, contract.running(backend)
        time.sleep(0.2)
