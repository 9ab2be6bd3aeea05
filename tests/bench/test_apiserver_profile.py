"""bench.apiserver_profile on the real local API server: a CPU profile taken while ConfigMaps are
created, patched, listed and deleted is read back, and its samples land in those request kinds."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bench import apiserver_profile
from infra.local.kube import LocalKube


def test_a_profile_of_the_api_server_is_attributed_to_the_requests_it_served(
    tmp_path: Path,
) -> None:
    with LocalKube(tmp_path / "kube", nodes=0, apiserver_args=apiserver_profile.FLAGS) as kube:
        summary = _profiled(kube, tmp_path / "apiserver.pprof")
    kinds = summary["by_request_kind_pct"]
    assert isinstance(kinds, dict) and isinstance(summary["cpu_s"], float)
    assert summary["cpu_s"] > 0
    assert {"create", "patch", "get/list"} <= set(kinds), kinds
    assert abs(sum(kinds.values()) - 100) < 1.0, kinds
    mechanisms = summary["by_mechanism_pct"]
    assert isinstance(mechanisms, dict) and "JSON" in mechanisms, mechanisms  # the Python client


def _profiled(kube: LocalKube, out: Path) -> dict[str, object]:
    """A 3-second profile while ConfigMaps are created, patched, listed and deleted."""
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api())
    profiling = apiserver_profile.start(kube, 3, out)
    deadline = time.monotonic() + 2.5
    names = []
    while time.monotonic() < deadline:
        name = f"p-{uuid.uuid4().hex[:8]}"
        core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {}})
        core.patch_namespaced_config_map(name, "default", {"data": {"k": "v" * 1000}})
        core.list_namespaced_config_map("default")
        names.append(name)
    for name in names:
        core.delete_namespaced_config_map(name, "default")
    return apiserver_profile.summarize(profiling.join())
