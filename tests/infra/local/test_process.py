"""Supervised service processes: a crash is reported with its log, never a hang."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from infra.local.process import ServiceProcess, processes_of
from schemas.errors import ServiceError


def test_a_crash_during_start_up_reports_the_log_tail(tmp_path: Path) -> None:
    proc = ServiceProcess(
        "crasher",
        [sys.executable, "-c", "print('port already in use'); raise SystemExit(3)"],
        tmp_path / "crasher.log",
    )
    proc.start()
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match="exited with code 3") as info:
        proc.wait_ready(lambda: False, timeout=60)
    assert "port already in use" in str(info.value)
    assert time.monotonic() - t0 < 30  # reported as soon as it died, not at the timeout


def test_stop_kills_the_whole_process_tree(tmp_path: Path) -> None:
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
    )
    proc = ServiceProcess("tree", [sys.executable, "-c", child], tmp_path / "tree.log")
    proc.start()
    deadline = time.monotonic() + 20
    while len(processes_of(proc.service_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes_of(proc.service_id)) == 2  # the service and its child
    proc.stop(grace=5)
    assert processes_of(proc.service_id) == []


def test_not_ready_in_time_is_an_error_and_the_process_is_stopped(tmp_path: Path) -> None:
    proc = ServiceProcess(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "sleeper.log"
    )
    proc.start()
    with pytest.raises(ServiceError, match="not ready after"):
        proc.wait_ready(lambda: False, timeout=1)
    assert processes_of(proc.service_id) == []  # stopped, not left behind
