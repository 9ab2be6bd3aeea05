"""What a rollout pod's containers report of their own cgroups, read back as the rollout's costs:
the shell the pod runs (real ``/bin/sh`` here, over this machine's cgroup files) and the parser,
with any termination message a container could leave."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import kube_status
from orchestrator.kube_pod import _USAGE


def _report(script: str) -> dict[str, Any]:
    done = subprocess.run(["/bin/sh", "-c", _USAGE + script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {"message": done.stdout}


def test_the_wrappers_report_is_json_with_the_cgroups_counters() -> None:
    agent = _report('printf \'{"exit_code": %d%s}\' 0 "$(usage)"')
    meta = json.loads(agent["message"])
    assert meta["exit_code"] == 0 and meta["cpu_us"] > 0 and meta["peak_bytes"] > 0
    costs = kube_status.usage(agent, "agent")
    assert costs == pytest.approx(
        {"agent_cpu_s": meta["cpu_us"] / 1e6, "agent_peak_mib": meta["peak_bytes"] / 2**20}
    )
    verifier = _report('printf \'{"exit_code": 0, "file": "reward.txt"%s}\\n1\' "$(usage)"')
    assert set(kube_status.usage(verifier, "verifier")) == {"verifier_cpu_s", "verifier_peak_mib"}
    assert kube_status.verifier_result({**verifier, "startedAt": None})[0].reward == 1.0


@given(
    st.one_of(
        st.text(max_size=200),
        st.dictionaries(
            st.text(max_size=12),
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False)
            | st.text(max_size=5),
            max_size=4,
        ).map(json.dumps),
    )
)
def test_any_message_gives_only_non_negative_counters(message: str) -> None:
    costs = kube_status.usage({"message": message}, "agent")
    assert set(costs) <= {"agent_cpu_s", "agent_peak_mib"}
    assert all(value >= 0 for value in costs.values())
