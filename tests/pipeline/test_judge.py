"""The judge stage (pipeline.judge) on real recorded sessions: multi-turn sessions in the three
dialects go through a real proxy to a real vLLM; ``openforge pipeline run --judge-url`` (run
from the directory of a relative ``local:`` log, as a user types it) scores each finished
session through the same vLLM, and the episodes carry the judge's score beside the feedback,
combined by the reward policy. The judge's calls are not recorded; a restarted job judges
nothing again and counts nothing late; a judge that cannot be reached gives no score, and the
rollouts that required one are dead-lettered saying so."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, records_in
from infra.judge import JudgeConfig
from infra.local.vllm import VLLMServer
from openforge.testing.proxy import proxy_config, running_proxy
from openforge.traffic.dialects import PATHS, Dialect, headers, reply_text, request
from pipeline.jobs import Outputs, run_streaming
from pipeline.judge import JUDGE, JUDGEMENTS_TOPIC
from pipeline.rewards import RewardPolicy
from pipeline.transcript import transcript
from schemas.completion import CompletionEvent
from schemas.episode import Episode
from schemas.reward import RewardEvent

FEEDBACK = "fb-secret"


def _sessions(vllm: VLLMServer, tmp: Path) -> tuple[str, dict[Dialect, str]]:
    """Two-turn sessions, one per dialect, through a real proxy in open mode, ended by idling;
    feedback posted for the chat one. The log's URL, relative to ``tmp``, and the sessions."""
    config = proxy_config(
        vllm.base_url, tmp, log_url=f"local:{tmp / 'events'}", open_mode=True,
        session_idle_timeout=0.5, feedback_token=FEEDBACK,
    )  # fmt: skip
    sessions = {d: f"{d.value}-{uuid.uuid4().hex[:6]}" for d in Dialect}
    with running_proxy(config) as p:
        for dialect, session in sessions.items():
            turns = [("user", f"Write the word {dialect.value} twice.")]
            for _ in range(2):
                resp = httpx.post(
                    p.url + PATHS[dialect],
                    json=request(dialect, turns, 6),
                    headers=headers(dialect, session),
                    timeout=60,
                )
                assert resp.status_code == 200, resp.text
                turns += [("assistant", reply_text(dialect, resp.json())), ("user", "Again.")]
        deadline = time.monotonic() + 30
        while p.state.rollouts:  # each session ends once idle
            assert time.monotonic() < deadline, "the sessions did not end"
            time.sleep(0.1)
        posted = httpx.post(
            f"{p.url}/sessions/{sessions[Dialect.CHAT]}/reward",
            json={"reward": 1},
            headers={"authorization": f"Bearer {FEEDBACK}"},
            timeout=30,
        )
        assert posted.status_code == 201, posted.text
        p.flush()
    return "local:events", sessions


def _pipeline(tmp: Path, log: str, judge_url: str, *extra: str) -> str:
    """``openforge pipeline run`` as a user types it, from ``tmp``; its report line."""
    argv = [
        sys.executable, "-m", "openforge", "pipeline", "run", "--source", log,
        "--stop-when-idle", "6", "--lateness", "120", "--judge-url", judge_url,
        "--reward-weight", "judge=0.5", "--reward-weight", "feedback=1",
        "--reward-required", JUDGE, *extra,
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = re.search(r"pipeline run \(streaming\).*", done.stdout)
    assert line is not None, done.stdout[-2000:]
    return line[0]


def _count(report: str, name: str) -> int:
    found = re.search(rf"\b{name} (\d+)", report)
    return int(found[1]) if found else 0


def test_the_judge_scores_each_finished_session_once_and_is_never_recorded(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    log, sessions = _sessions(vllm_server, tmp_path)
    url = f"local:{tmp_path / 'events'}"
    calls = [r for r in records_in(url, EVENTS_TOPIC) if isinstance(r, CompletionEvent)]
    assert len(calls) == 6
    for session in sessions.values():  # what the judge reads: both turns and the last answer
        text = transcript(c for c in calls if c.rollout_id == f"session-{session}")
        assert text is not None and text.count("user:") == 2 and text.count("assistant:") == 2, text

    report = _pipeline(tmp_path, log, vllm_server.base_url)
    assert _count(report, "judge_scored") == 3 and _count(report, "episodes_emitted") == 3, report

    episodes = {e.rollout_id: e for e in records_in(url, EPISODES_TOPIC) if isinstance(e, Episode)}
    assert set(episodes) == {f"session-{s}" for s in sessions.values()}
    for rollout_id, episode in episodes.items():
        judged = episode.reward_components[JUDGE]
        assert 0.0 <= judged <= 1.0 and judged * 10 == round(judged * 10)
        feedback = 1.0 if rollout_id == f"session-{sessions[Dialect.CHAT]}" else 0.0
        assert episode.reward == pytest.approx(0.5 * judged + feedback)
    verdicts = [r for r in records_in(url, EVENTS_TOPIC) if isinstance(r, RewardEvent)]
    judged_by = sorted(r.rollout_id for r in verdicts if r.verifier == JUDGE)
    assert judged_by == sorted(episodes)
    assert all(r.verifier_output and r.verifier_output.startswith("tiny: ") for r in verdicts
               if r.verifier == JUDGE)  # fmt: skip
    again = [r for r in records_in(url, EVENTS_TOPIC) if isinstance(r, CompletionEvent)]
    assert len(again) == 6  # the judge's calls went to vLLM directly: none recorded
    assert len(list(records_in(url, JUDGEMENTS_TOPIC))) == 3

    restarted = _pipeline(tmp_path, log, vllm_server.base_url)
    assert _count(restarted, "judge_scored") == 0 and _count(restarted, "judge_already") == 3
    assert _count(restarted, "late_events") == 0 and _count(restarted, "already_written") == 3
    assert len([r for r in records_in(url, EVENTS_TOPIC) if isinstance(r, RewardEvent)]) == 4


def test_a_judge_that_cannot_be_reached_dead_letters_what_required_it(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    _, sessions = _sessions(vllm_server, tmp_path)
    url = f"local:{tmp_path / 'events'}"
    judge = JudgeConfig("http://127.0.0.1:9", "tiny", tries=1, timeout_s=2)
    policy = RewardPolicy({"feedback": 1.0, JUDGE: 0.5}, (JUDGE,))
    report = run_streaming(
        url, Outputs(url), allowed_lateness_s=4, stop_when_idle_s=6, policy=policy, judge=judge
    )
    assert report.counters.get("judge_failed") == 3, report.line()
    dead = [e for e in records_in(url, DEAD_LETTER_TOPIC) if isinstance(e, Episode)]
    assert sorted(e.rollout_id for e in dead) == sorted(f"session-{s}" for s in sessions.values())
    assert all("required rewards missing by the deadline: judge" in (e.dead_letter or "")
               for e in dead if e.rollout_id.endswith(sessions[Dialect.CHAT]))  # fmt: skip
    assert not [e for e in records_in(url, EPISODES_TOPIC) if isinstance(e, Episode)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--judge-model", "tiny"], "need --judge-url"),
        (["--judge-url", "http://127.0.0.1:9", "--judge-model", "m", "--judge-constraint", "x"],
         "unknown judge constraint"),
        (["--judge-url", "http://127.0.0.1:9", "--judge-rubric", "nowhere.txt"], "no such file"),
        (["--judge-url", "http://127.0.0.1:9"], "could not list the models"),
    ],
)  # fmt: skip
def test_bad_judge_options_are_refused_saying_what_to_give(
    tmp_path: Path, options: list[str], message: str
) -> None:
    argv = [sys.executable, "-m", "openforge", "pipeline", "run", "--source", "local:events"]
    done = subprocess.run(
        [*argv, *options], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
