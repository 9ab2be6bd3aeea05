"""What an agent can and cannot do from inside its sandbox, probed by a script that runs where a
harness would (same sandbox, same mounts, the rollout's key in its environment): the proxy
answers; vLLM, Kafka and any other loopback port do not; another rollout's workspace and the
proxy's admin credential cannot be read; the rollout key cannot post a reward; a background
process does not outlive the rollout; the memory limit ends a rollout as classified; and the
reward recorded is the verifier's."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from infra.local.kafka import KafkaBroker
from infra.local.vllm import VLLMServer
from infra.tasks import Task, load_task
from openforge.testing.proxy import read_events
from orchestrator.local import LocalBackend, LocalConfig
from orchestrator.rundir import Status
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent
from tests.orchestrator.conftest import Job, ScriptHarness, job

PROBE = r"""
set -u
out=/app/probe.json
can_connect() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
http() {  # METHOD PATH [BODY]: the proxy's answer (status line first)
  exec 3<>/dev/tcp/127.0.0.1/8100 || return 1
  local head='%s %s HTTP/1.0\r\nHost: proxy\r\nAuthorization: Bearer %s\r\n'
  head+='Content-Type: application/json\r\nContent-Length: %s\r\n\r\n%s'
  # shellcheck disable=SC2059
  printf "$head" "$1" "$2" "$OPENFORGE_API_KEY" "${#3}" "$3" >&3
  cat <&3
  exec 3<&-
}
{
  echo '{'
  echo "\"health\": $(http GET /health '' | grep -c '"status":"ok"'),"
  for port in $PORTS; do
    if can_connect "$port"; then r=open; else r=closed; fi
    echo "\"port_$port\": \"$r\","
  done
  if cat "$OTHER_WORKSPACE/secret.txt" >/dev/null 2>&1; then r=readable; else r=hidden; fi
  echo "\"other_workspace\": \"$r\","
  if cat "$ADMIN_TOKEN_FILE" >/dev/null 2>&1; then r=readable; else r=hidden; fi
  echo "\"admin_token_file\": \"$r\","
  if env | grep -q '^OPENFORGE_ADMIN'; then r=present; else r=absent; fi
  echo "\"admin_env\": \"$r\","
  status=$(http POST "/rollout/$ROLLOUT_ID/reward" '{"reward": 1.0}' | head -1 | cut -d' ' -f2)
  echo "\"reward_with_rollout_key\": \"$status\""
  echo '}'
} > "$out"
if [ "${HOG:-0}" = 1 ]; then x=$(head -c 300000000 /dev/zero | tr '\0' a); echo "${#x}"; fi
(exec -a openforge-probe-sleeper sleep 1000) &
setsid bash -c 'exec -a openforge-probe-sleeper sleep 1000' &
echo probed
"""

VERIFIER = """#!/usr/bin/env bash
mkdir -p /logs/verifier
echo '{"reward": 0.25, "probe_ran": 1}' > /logs/verifier/reward.json
"""


def _task(root: Path, memory_mb: int = 512) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "environment").mkdir()
    (root / "instruction.md").write_text("Probe the sandbox.\n")
    (root / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n'
        f'[environment]\nmemory_mb = {memory_mb}\nworkdir = "/app"\n'
    )
    (root / "tests" / "test.sh").write_text(VERIFIER)
    return root


def _sleepers() -> list[str]:
    found = subprocess.run(
        ["pgrep", "-f", "openforge-probe-sleeper"], capture_output=True, text=True
    )
    return found.stdout.split()


def _served_warm(job: Job, primer: Task) -> None:
    """Until the pool holds a ready member for the probe's agent: a first rollout (of another
    task with the same environment) asks for the shape, and a member starts behind it."""
    backend = job.orchestrator.backend
    assert isinstance(backend, LocalBackend) and backend.pool is not None
    job.run([primer])
    deadline = time.monotonic() + 60
    while backend.pool.ready() < 1:
        assert time.monotonic() < deadline, backend.pool.stats
        time.sleep(0.1)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm-pool"])
def test_what_an_agent_can_reach_from_its_sandbox(
    tiny_model_dir: Path,
    tmp_path: Path,
    vllm_server: VLLMServer,
    kafka_broker: KafkaBroker,
    warm: bool,
) -> None:
    """Also from a warm pool's member: the same guarantees for an agent started ahead."""
    listener = socket.create_server(("127.0.0.1", 0))  # any other loopback service
    threading.Thread(target=lambda: listener.accept(), daemon=True).start()
    other = tmp_path / "other-rollout" / "workspace"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("not yours")
    task = load_task(_task(tmp_path / "probe-task"))
    probe = ScriptHarness(PROBE, warm=warm)
    local = LocalConfig(warm_pool=1) if warm else None
    with job(tmp_path / "job", probe, tiny_model_dir, local=local) as j:
        if warm:
            _served_warm(j, load_task(_task(tmp_path / "primer-task")))
        token_file = j.proxy.config.spool_dir.parent / "proxy-admin-token"
        assert token_file.read_text() == j.proxy.config.admin_token
        proxy_port = j.proxy.url.rsplit(":", 1)[1]
        ports = [str(vllm_server.port), str(kafka_broker.port), str(listener.getsockname()[1])]
        probe.extra = {
            "PORTS": " ".join([*ports, proxy_port]),
            "OTHER_WORKSPACE": str(other),
            "ADMIN_TOKEN_FILE": str(token_file),
        }
        (record,) = j.run([task])
        j.proxy.flush()
        events = read_events(j.proxy.config.log_url, want=5)
    listener.close()
    (verified,) = [
        e
        for e in events
        if isinstance(e, RolloutEvent)
        and e.rollout_id == record.rollout_id
        and e.phase == "verified"
    ]
    assert verified.costs["agent_warm"] == (1.0 if warm else 0.0), verified.costs
    assert record.status is Status.VERIFIED and record.agent_phase == "finished", record
    found = json.loads(
        (j.out / "rollouts" / record.rollout_id / "workspace" / "probe.json").read_text()
    )
    assert found["health"] == 1  # the proxy answers through the sandbox's forwarder
    for port in [*ports, proxy_port]:  # vLLM, Kafka, another service, the proxy's own TCP port
        assert found[f"port_{port}"] == "closed", (port, found)
    assert found["other_workspace"] == "hidden"
    assert found["admin_token_file"] == "hidden" and found["admin_env"] == "absent"
    assert found["reward_with_rollout_key"] == "401"
    assert _sleepers() == []  # the background processes died with the sandbox
    # The reward recorded is the verifier's, with its components; the agent's attempt is not one.
    (reward,) = [
        e for e in events if isinstance(e, RewardEvent) and e.rollout_id == record.rollout_id
    ]
    assert reward.reward == 0.25 and reward.components == {"reward": 0.25, "probe_ran": 1.0}


def test_exceeding_the_memory_limit_ends_the_rollout_as_classified(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    task = load_task(_task(tmp_path / "hog-task", memory_mb=64))
    probe = ScriptHarness(PROBE, {"PORTS": "", "OTHER_WORKSPACE": "/nonexistent",
                                  "ADMIN_TOKEN_FILE": "/x", "HOG": "1"})  # fmt: skip
    with job(tmp_path / "job", probe, tiny_model_dir) as j:
        (record,) = j.run([task])
    assert record.status is Status.VERIFIED  # the agent's failure is scored, not retried
    assert record.agent_phase == RolloutPhase.FAILED.value
    assert record.message.startswith("out_of_memory"), record.message
    assert _sleepers() == []
