"""Fixtures for the orchestrator tests: the example tasks, a real proxy (in a thread, on a Unix
socket for the sandboxes) and a helper that runs a job through the real local backend."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.harnesses import Harness
from infra.harnesses.base import (
    Capabilities,
    Endpoint,
    Invocation,
    Network,
    Preload,
    Report,
    RolloutDirs,
    SystemHarness,
)
from infra.sandbox import ProxyEndpoint
from infra.tasks import Task, load_task
from openforge.testing.proxy import RunningProxy, proxy_config, running_proxy
from orchestrator.backend import RunProxy
from orchestrator.local import LocalConfig
from orchestrator.plan import plan
from orchestrator.registry import RolloutBackendConfig, build_backend
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RolloutOutcome, RunDir
from schemas.enums import Dialect
from schemas.faults import FaultPlan

# The task fixtures' own verifier tests (run inside sandboxes), not tests of this suite.
collect_ignore_glob = ["data/*"]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
NO_UPSTREAM = "http://127.0.0.1:9"  # for harnesses that call no model


@dataclass
class Job:
    proxy: RunningProxy
    orchestrator: Orchestrator
    out: Path

    def run(self, tasks: Sequence[Task], n: int = 1) -> list[RolloutOutcome]:
        return self.orchestrator.run(plan(tasks, n, run_id=self.out.name))


@contextmanager
def job(
    tmp: Path,
    harness: Harness,
    tiny_model_dir: Path,
    upstream: str = NO_UPSTREAM,
    concurrency: int = 4,
    max_attempts: int = 1,
    local: LocalConfig | None = None,
    max_model_len: int = 4096,
    faults: FaultPlan | None = None,
) -> Iterator[Job]:
    """A proxy on ``upstream`` and an orchestrator of ``harness`` on the local backend (built
    from its config section ``local``, as the command line builds it); without an upstream the
    proxy checks prompts against ``max_model_len``; the proxy injects the call ``faults``, the
    sandboxes the rollout ones."""
    kw: dict[str, Any] = {"faults": faults}
    if upstream == NO_UPSTREAM:
        kw |= {"max_model_len": max_model_len, "upstream_model": "tiny"}
    config = proxy_config(upstream, tmp / "proxy", tokenizer=tiny_model_dir, **kw)
    with running_proxy(config, unix_socket=tmp / "proxy" / "proxy.sock") as proxy:
        assert proxy.unix_socket is not None
        run_proxy = RunProxy(proxy.url, ProxyEndpoint(proxy.unix_socket, 8100))
        backend = build_backend(RolloutBackendConfig(local=local or LocalConfig()), run_proxy)
        orchestrator = Orchestrator(
            backend,
            harness,
            proxy.admin,
            RunDir(tmp / "run"),
            OrchestratorConfig(
                concurrency=concurrency, max_attempts=max_attempts, backoff_s=0.1, faults=faults
            ),
        )
        try:
            yield Job(proxy, orchestrator, tmp / "run")
        finally:
            backend.close()


def run_objects(core: Any, ns: str, run_label: str) -> list[str]:
    """A Kubernetes run's pods, secrets and config maps in ``ns`` (kind/name)."""
    sel = f"openforge.dev/run={run_label}"
    return [
        f"{kind}/{o.metadata.name}"
        for kind, items in (
            ("pod", core.list_namespaced_pod(ns, label_selector=sel).items),
            ("secret", core.list_namespaced_secret(ns, label_selector=sel).items),
            ("configmap", core.list_namespaced_config_map(ns, label_selector=sel).items),
        )
        for o in items
    ]


def wait_gone(core: Any, ns: str, run_label: str, timeout: float = 60.0) -> None:
    """Until nothing of the run is left in ``ns`` (the garbage collector's work)."""
    deadline = time.monotonic() + timeout
    left: list[str] = []
    while time.monotonic() < deadline:
        left = run_objects(core, ns, run_label)
        if not left:
            return
        time.sleep(0.5)
    raise AssertionError(f"left behind after {timeout:.0f}s: {left}")


class ScriptHarness(SystemHarness):
    """Runs a bash ``script`` as the agent, with the rollout's key and id and ``extra`` in its
    environment: the isolation tests' probes (``extra`` may be set until the rollout starts)."""

    name = "probe"
    dialect = Dialect.CHAT
    # It talks to the proxy, so it says so: its sandbox gets the forwarder, its pod the policy.
    capabilities = Capabilities(calls_model=True, network=Network.PROXY)

    def __init__(self, script: str, extra: dict[str, str] | None = None, warm: bool = False):
        self.script = script
        self.extra = dict(extra or {})
        self.warm = warm

    def preload(self) -> Preload | None:
        """With ``warm``: a warm pool's member (the machine's Python, standing by) runs it."""
        return Preload(Path("/usr/bin/python3"), ("json",)) if self.warm else None

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        path = dirs.home / "probe.sh"
        path.write_text(self.script)
        env = self.base_env(dirs, endpoint)
        env.update(self.extra, OPENFORGE_API_KEY=endpoint.api_key, ROLLOUT_ID=endpoint.rollout_id)
        return Invocation(["/bin/bash", str(path)], env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        return Report(final_message=stdout.strip().splitlines()[-1] if stdout.strip() else None)


def marked_tasks(tmp: Path, markers: Iterable[str]) -> list[Task]:
    """The echo-data task once per marker (a directory of ``tmp`` each, named by the marker
    without its brackets), the marker at the end of its instruction: what a scripted policy's
    plans key on (``openforge.testing.policy.Script``)."""
    tasks = []
    for marker in markers:
        root = tmp / marker.strip("[]")
        shutil.copytree(EXAMPLES.parent / "echo-words" / "echo-data", root)
        (root / "instruction.md").write_text(f"Write the word data to answer.txt. {marker}\n")
        tasks.append(load_task(root))
    return tasks
