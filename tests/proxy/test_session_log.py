"""Session ends survive a proxy's restart (proxy.session_log): a session that ended before the
restart goes on in a new rollout after it, never under the id of the one that ended (whose
episode may be built already), and feedback by session after the restart still finds the
session's last rollout; the file stays bounded and a damaged line is skipped."""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from pathlib import Path

import httpx
from hypothesis import given
from hypothesis import strategies as st

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import completions_of, proxy_config, read_events, running_proxy
from proxy.session_log import FILE, SessionLog
from schemas.enums import RolloutPhase
from schemas.reward import RewardEvent
from tests.proxy.test_sessions import _call, _phases, _until


def test_a_session_ended_before_a_restart_goes_on_in_a_new_rollout_after_it(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(
        vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=0.5,
        feedback_token="fb-restart",
    )  # fmt: skip
    session = uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _call(p, session) == 200
        _until("the idle session ends", lambda: p.state.rollouts.by_session(session) is None)
        p.flush()
    with running_proxy(config) as p:  # the same spool directory: a restart
        feedback = httpx.post(
            f"{p.url}/sessions/{session}/reward", json={"reward": 1},
            headers={"authorization": "Bearer fb-restart"}, timeout=30,
        )  # fmt: skip
        assert feedback.status_code == 201, feedback.text
        assert feedback.json()["rollout_id"] == f"session-{session}"
        assert _call(p, session) == 200
        after = p.state.rollouts.by_session(session)
        assert after is not None and after.rollout_id.startswith(f"session-{session}.")
        p.flush()
    started = [
        (r, ph) for r, ph, _ in _phases(config.log_url, session) if ph is RolloutPhase.STARTED
    ]
    assert [r for r, _ in started] == [f"session-{session}", after.rollout_id]
    rewards = [
        r for r in read_events(config.log_url, group="r", want=1) if isinstance(r, RewardEvent)
    ]
    assert [r.rollout_id for r in rewards] == [f"session-{session}"]


def test_sessions_live_at_a_stop_go_on_in_the_next_proxy_or_end_when_idle(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    config = proxy_config(vllm_server.base_url, tmp_path, open_mode=True, session_idle_timeout=2)
    back, gone = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    with running_proxy(config) as p:
        assert _call(p, back) == 200 and _call(p, gone) == 200
    with running_proxy(config) as p:  # stopped with both live, started again on the same spool
        assert _call(p, back) == 200
        again = p.state.rollouts.by_session(back)
        assert again is not None and again.rollout_id == f"session-{back}" and again.calls == 2
        _until("the session that did not come back ends", lambda: not p.state.rollouts.live(), 20)
        p.flush()
    records = read_events(config.log_url, group="live", want=1)
    indexes = [c.call_index for c in completions_of(records, f"session-{back}")]
    assert indexes == [0, 1]  # numbered on: one rollout across the restart
    for session in (back, gone):
        phases = [(r, ph) for r, ph, _ in _phases(config.log_url, session)]
        rollout = f"session-{session}"
        assert phases == [(rollout, RolloutPhase.STARTED), (rollout, RolloutPhase.FINISHED)]
    assert not (tmp_path / "spool" / "sessions-live").exists()  # taken over once


@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.text(max_size=8)), max_size=40),
       st.integers(1, 5))  # fmt: skip
def test_the_log_keeps_each_sessions_last_rollout_and_at_most_its_capacity(
    ends: list[tuple[str, str]], capacity: int
) -> None:
    spool = Path(f"/tmp/openforge-session-log-{uuid.uuid4().hex}")
    log = SessionLog(spool, capacity)
    log.load()
    for identity, rollout in ends:
        log.append(identity, rollout)
    with (spool / FILE).open("a") as f:
        f.write("not json\n[1]\n")  # damaged lines: skipped
    expected: OrderedDict[str, str] = OrderedDict()
    for identity, rollout in ends:
        expected.pop(identity, None)
        expected[identity] = rollout
    while len(expected) > capacity:
        expected.popitem(last=False)
    assert log.load() == expected
    lines = (spool / FILE).read_text().splitlines()
    assert [tuple(json.loads(line)) for line in lines] == list(expected.items())  # compacted
    (spool / FILE).unlink()
    spool.rmdir()
