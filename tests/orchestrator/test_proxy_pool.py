"""Rollouts through a proxy pool (``openforge proxy --workers 2 --uds PATH``), for real: the
built-in agent in bubblewrap sandboxes, two worker processes, the embedded event log.

Each sandbox gets the socket of the worker that owns its rollout, so every call lands on that
worker with no hop through the front: the front forwards nothing, and each worker's own
counters show its rollout's calls. A worker killed with SIGKILL is restarted by the pool on the
same socket file, and the next rollouts assigned to it are served through it again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from infra.harnesses import Agent
from infra.proxy_client import ProxyAdmin
from infra.sandbox import BubblewrapSandbox, ProxyEndpoint
from infra.tasks import load_dataset
from openforge.stack import proxy_process
from openforge.testing import fast_upstream
from openforge.testing.proxy import completions_of, read_events
from openforge.threaded import serve_in_thread
from orchestrator.local import LocalBackend
from orchestrator.plan import plan
from orchestrator.run import Orchestrator, OrchestratorConfig
from orchestrator.rundir import RunDir, Status
from schemas.enums import CompletionStatus
from tests.orchestrator.conftest import EXAMPLES


def test_each_rollout_calls_its_own_worker_also_after_the_worker_restarts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (task,) = [t for t in load_dataset(EXAMPLES) if t.id == "write-file"]
    log_url = f"local:{tmp_path / 'events'}"
    front_socket = tmp_path / "p" / "proxy.sock"
    with (
        serve_in_thread(fast_upstream.create_app(str(tiny_model_dir), 4), "upstream") as up,
        proxy_process(
            up,
            model="fast",
            tokenizer=tiny_model_dir,
            log_url=log_url,
            out=tmp_path / "p",
            extra_args=["--workers", "2"],
            unix_socket=front_socket,
        ) as admin,
    ):
        backend = LocalBackend(BubblewrapSandbox(), ProxyEndpoint(front_socket, 8100))
        orchestrator = Orchestrator(
            backend,
            Agent(max_turns=1, max_tokens=4),
            admin,
            RunDir(tmp_path / "run"),
            OrchestratorConfig(concurrency=2, max_attempts=1, model="fast"),
        )
        first = orchestrator.run(plan([task], 2, run_id="pool"))
        assert [r.status for r in first] == [Status.VERIFIED] * 2
        metrics = _metrics(admin)
        assert metrics.get("openforge_proxy_front_forwarded_total", {}) == {}
        assert metrics["openforge_proxy_front_registrations_total"] == {"0": 1.0, "1": 1.0}
        served = metrics["openforge_proxy_requests_total"]  # each worker's own counter
        assert served["0"] >= 1 and served["1"] >= 1

        workers = httpx.get(f"{admin.url}/admin/workers", headers=_auth(admin)).json()["workers"]
        inode = Path(workers[1]["unix_socket"]).stat().st_ino
        os.kill(workers[1]["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 90  # a restart imports torch again: slow on busy cores
        while not _restarted(admin):
            assert time.monotonic() < deadline, "the killed worker was not restarted"
            time.sleep(0.2)
        assert Path(workers[1]["unix_socket"]).stat().st_ino == inode  # the same socket file

        second = orchestrator.run(plan([task], 2, run_id="again"))
        assert [r.status for r in second] == [Status.VERIFIED] * 2
        metrics = _metrics(admin)
        assert metrics.get("openforge_proxy_front_forwarded_total", {}) == {}
        assert metrics["openforge_proxy_worker_restarts"] == {"0": 0.0, "1": 1.0}
        assert metrics["openforge_proxy_requests_total"]["1"] >= 1  # the new process served
    records = read_events(log_url, want=4 * 6)
    for r in [*first, *second]:
        calls = completions_of(records, r.rollout_id)
        assert calls and all(c.status is CompletionStatus.OK for c in calls), r.rollout_id
    log_text = (tmp_path / "p" / "proxy.log").read_text()
    assert "proxy worker 1 (" in log_text and "exited with status -9" in log_text


def _metrics(admin: ProxyAdmin) -> dict[str, dict[str, float]]:
    """The front's /metrics: per sample name, the value summed over other labels, by worker."""
    out: dict[str, dict[str, float]] = {}
    text = httpx.get(f"{admin.url}/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "worker" in s.labels:
                by = out.setdefault(s.name, {})
                by[s.labels["worker"]] = by.get(s.labels["worker"], 0.0) + s.value
    return out


def _auth(admin: ProxyAdmin) -> dict[str, str]:
    return {"authorization": f"Bearer {admin.token}"}


def _restarted(admin: ProxyAdmin) -> bool:
    """Worker 1 was restarted and every worker answers (the health check waits longer than the
    front's 5 s per worker: a worker still starting answers only when ready)."""
    workers = httpx.get(f"{admin.url}/admin/workers", headers=_auth(admin)).json()["workers"]
    healthy = httpx.get(f"{admin.url}/health", timeout=20).status_code == 200
    return bool(workers[1]["restarts"] == 1 and healthy)
