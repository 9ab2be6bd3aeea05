"""``openforge tasks build`` and a run with a task whose image cannot be built, as a user types
them from the repository root: real buildah, real containers, relative paths."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from infra.harnesses import Agent
from infra.images.sinks import RegistrySink
from infra.local.kube import LocalKube
from infra.local.registry import LocalRegistry

ROOT = Path(__file__).resolve().parents[2]


def _openforge(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openforge", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_tasks_build_builds_each_image_once() -> None:
    first = _openforge("tasks", "build", "examples/images")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 tasks: 4 ready, 0 refused" in first.stdout
    again = _openforge("tasks", "build", "examples/images")
    assert again.returncode == 0 and again.stdout.count("(cached)") == 4, again.stdout
    assert "building" not in again.stdout
    assert "run-as-user: image localhost/openforge/task:" in again.stdout
    assert "user worker" in again.stdout


def test_a_task_whose_image_does_not_build_is_refused_and_the_others_run(tmp_path: Path) -> None:
    tasks = ROOT / "runs" / f"test-refused-{os.getpid()}"
    try:
        shutil.copytree(ROOT / "examples" / "tasks" / "write-file", tasks / "good")
        shutil.copytree(ROOT / "examples" / "tasks" / "write-file", tasks / "bad")
        dockerfile = tasks / "bad" / "environment" / "Dockerfile"
        dockerfile.write_text("FROM debian:bookworm-slim\nWORKDIR /app\nRUN exit 3\n")
        rel = tasks.relative_to(ROOT)
        done = _openforge(
            "rollouts", "run", "--tasks", str(rel), "--harness", "oracle", "--out", str(rel / "out")
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "refused bad: task bad: its image did not build" in done.stdout
        assert "Dockerfile:3: RUN exit 3" in done.stdout
        assert "1 verified" in done.stdout and "mean reward 1.000" in done.stdout
        assert "1 tasks refused: bad" in done.stdout
        build = _openforge("tasks", "build", str(rel))
        assert build.returncode == 1 and "2 tasks: 1 ready, 1 refused" in build.stdout
    finally:
        shutil.rmtree(tasks, ignore_errors=True)


def test_tasks_build_pushes_to_a_registry_that_a_node_pulls_from(
    real_kube: LocalKube, tmp_path: Path
) -> None:
    """`--push` puts the task's image (with the agent's install added, as pods run it) in a real
    registry; a pod on the real node, whose containerd never had it, pulls it from there."""
    from kubernetes import client

    node = real_kube.real_node
    assert node is not None
    with LocalRegistry(tmp_path / "registry") as registry:
        done = _openforge(
            "tasks", "build", "examples/images/package-count",
            "--push", f"{registry.host}/team", "--harness", "agent",
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        (pushed,) = re.findall(r"pushed (\S+)", done.stdout)
        assert pushed.startswith(f"{registry.host}/team/openforge/with-agent:")
        assert RegistrySink(registry.host).holds(pushed)
        assert not node.sink.holds(pushed)  # the node has to pull it
        again = _openforge("tasks", "build", "examples/images/package-count",
                           "--push", f"{registry.host}/team", "--harness", "agent")  # fmt: skip
        assert again.returncode == 0 and f"pushed {pushed}" in again.stdout  # a lookup now

        core = client.CoreV1Api(real_kube.api())
        name = f"pulled-{os.getpid()}"
        # Both layers: the task's (debian-slim, WORKDIR /srv, no Python) and the agent's Python
        python = Agent().executable()
        script = f"cd /srv && {python} -c 'import openai' && echo pulled-and-ran"
        core.create_namespaced_pod("default", {
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "c", "image": pushed, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }]},
        })  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while (
                core.read_namespaced_pod(name, "default").status.phase
                not in ("Succeeded", "Failed")
                and time.monotonic() < deadline
            ):
                time.sleep(0.5)
            log = core.read_namespaced_pod_log(name, "default")
            assert core.read_namespaced_pod(name, "default").status.phase == "Succeeded", log
            assert log.strip().endswith("pulled-and-ran")
            events = core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={name}"
            ).items
            assert any(e.reason == "Pulled" and pushed in e.message for e in events)
            assert node.sink.holds(pushed)  # pulled into the node's containerd
        finally:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_push_names_what_it_needs(tmp_path: Path) -> None:
    no_registry = _openforge(
        "tasks", "build", "examples/images/package-count", "--harness", "agent"
    )
    assert no_registry.returncode != 0
    assert "give --push REGISTRY too" in no_registry.stdout + no_registry.stderr
    closed = _openforge("tasks", "build", "examples/images/package-count", "--push", "127.0.0.1:9")
    assert closed.returncode == 1, closed.stdout
    assert "pushing localhost/openforge/task:" in closed.stdout and "127.0.0.1:9" in closed.stdout
