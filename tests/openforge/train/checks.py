"""What a short `openforge train` run must leave behind, checked in depth: its summary, curves,
checkpoints and archive; every event in its event log (update 1 trained on v0 rollouts, update 2
on v1; never on a held-out task); each query view counting what the log holds; the lineage of
each step naming the episodes the trainer consumed and where it read them; the audit page
drawing every chart; what `openforge replay rebuild` of its archive wrote; and, rerun, a resume
with nothing left to do. Used by the README's main job and its later commands (tests/readme:
the README's own `replay rebuild` compares each rebuilt episode with the archived one) and by the
same config on Kafka (test_run.py).
"""

from __future__ import annotations

import csv
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from infra.eventlog import DEAD_LETTER_TOPIC, EPISODES_TOPIC, EVENTS_TOPIC, open_reader
from infra.image_store import ImageStore
from infra.tasks import load_dataset
from openforge.audit import html
from openforge.audit.report import CHART_NAMES, build
from openforge.query.views import open_views
from openforge.stack import tiny_model
from schemas.codec import Record, decode_message
from schemas.completion import CompletionEvent
from schemas.episode import Episode
from schemas.reward import RewardEvent
from schemas.rollout import COSTS, RolloutEvent
from tests.openforge.audit.conftest import rendered

WEB_TASKS = Path(__file__).resolve().parents[3] / "examples" / "web-tasks"


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


ECHO_HELDOUT = {
    "echo-" + w for w in ("read", "long", "come", "made", "look", "two", "other", "about")
}


def check_run(
    out: Path,
    log_url: str,
    per_update: int,
    heldout: set[str] = ECHO_HELDOUT,
    updates: int = 2,
) -> None:
    """What every short run (``updates`` updates, evaluated at the first and the last policy)
    must leave behind, whatever its event log; ``per_update``: the episodes each update trains
    on (tasks per step x samples per task); ``heldout``: the ids of the held-out tasks (the main
    job's by default)."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] == updates and summary["policy_version"] == updates
    # The summary says which faults were injected into training (none, unless configured).
    rates = tomllib.loads((out / "config.toml").read_text()).get("faults", {}).get("rates", {})
    assert summary["faults"] == {k: r for k, r in rates.items() if r > 0}
    # Held-out evaluations at the initial and the final policy, recorded.
    assert sorted(int(v) for v in summary["heldout"]) == [0, updates]
    assert (out / "curves.png").stat().st_size > 0
    assert (out / "trainer" / "metrics.csv").exists()
    assert any((out / "trainer" / "tensorboard").iterdir())
    assert (out / "trainer" / "checkpoints" / "LATEST").exists()
    assert list((out / "archive").rglob("*.parquet"))  # the run's Parquet archive

    topics = [EVENTS_TOPIC, EPISODES_TOPIC, DEAD_LETTER_TOPIC]
    with open_reader(log_url, topics, "check") as reader:
        records = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    completions = [e for e in records if isinstance(e, CompletionEvent)]
    stamped = {s.version for c in completions for s in c.policy_versions}
    assert {0, 1} <= stamped, stamped  # update 1 trained on v0 rollouts; v1 played after it
    consumed = [
        json.loads(line) for line in (out / "trainer" / "consumed.jsonl").read_text().splitlines()
    ]
    trained = {e for row in consumed for e in row["episodes"]}
    assert len(trained) == updates * per_update
    episodes = {e.episode_id: e for e in records if type(e).__name__ == "Episode"}
    assert all(episodes[e].task_id not in heldout for e in trained)  # never trained on held-out
    assert any(e.task_id in heldout for e in episodes.values())  # but they are recorded
    played = {p.parent.name for p in out.glob("*/rollouts/*/result.json")}
    assert played and played <= {e.rollout_id for e in episodes.values()}  # none left behind
    _check_views(out, records, played)
    _check_costs(out, updates)
    _check_lineage(out, log_url, consumed, episodes, per_update, updates)

    assert processes_mentioning(str(out)) == []  # vLLM, the proxy, the pipeline: all stopped


def _count(con: Any, sql: str) -> int:
    return int(con.sql(sql).fetchall()[0][0])


def _check_views(out: Path, records: list[Record], played: set[str]) -> None:
    """Each view over the run's archive counts what the event log holds."""
    con = open_views(run=out)
    calls = {r.event_id: r for r in records if isinstance(r, CompletionEvent)}
    phases = {r.event_id for r in records if isinstance(r, RolloutEvent)}
    rewards = {r.event_id: r for r in records if isinstance(r, RewardEvent)}
    episodes: dict[str, Episode] = {}
    for e in records:  # an episode supersedes a dead letter of its rollout
        if isinstance(e, Episode) and (e.dead_letter is None or e.episode_id not in episodes):
            episodes[e.episode_id] = e
    assert _count(con, "SELECT count(*) FROM completions") == len(calls) > 0
    tokens = sum(len(c.completion_token_ids) for c in calls.values())
    assert _count(con, "SELECT count(*) FROM tokens") == tokens > 0
    assert _count(con, "SELECT count(*) FROM rollouts") == len(phases)
    assert _count(con, "SELECT count(DISTINCT rollout_id) FROM rollouts") >= len(played)
    assert _count(con, "SELECT count(*) FROM rewards") == len(rewards)
    verified = {
        p.parent.name
        for p in out.glob("*/rollouts/*/result.json")
        if json.loads(p.read_text()).get("status") == "verified"
    }
    assert {r.rollout_id for r in rewards.values()} == verified  # one per rollout scored
    assert _count(con, "SELECT count(*) FROM episodes") == len(episodes)
    samples = sum(len(e.samples) for e in episodes.values())
    assert _count(con, "SELECT count(*) FROM samples") == samples > 0
    assert _count(con, "SELECT count(*) FROM forks") == sum(len(e.forks) for e in episodes.values())


def _check_lineage(
    out: Path,
    log_url: str,
    consumed: list[dict[str, Any]],
    episodes: dict[str, Episode],
    per_update: int,
    updates: int,
) -> None:
    """The lineage of each step names exactly the episodes the trainer consumed, with their
    rollouts, and the log offsets it read them at hold those episodes."""
    con = open_views(run=out)
    metrics = {
        int(float(r["step"])): r
        for r in csv.DictReader((out / "trainer/metrics.csv").read_text().splitlines())
    }
    with open_reader(log_url) as reader:
        for step in range(1, updates + 1):
            rows = con.sql(
                "SELECT episode_id, rollout_id, log_topic, log_partition, log_offset, "
                f"policy_version, metrics FROM steps WHERE step = {step}"
            ).fetchall()
            (wanted,) = [row["episodes"] for row in consumed if row["step"] == step]
            assert sorted(r[0] for r in rows) == sorted(wanted) and len(rows) == per_update
            for episode_id, rollout_id, topic, partition, offset, version, measured in rows:
                assert rollout_id == episodes[episode_id].rollout_id
                assert topic == EPISODES_TOPIC and version == step
                (at,) = reader.read(topic, partition, offset, 1, timeout=2.0).records
                assert [e.episode_id for e in decode_message(at.value)] == [episode_id]
                assert measured["reward/mean"] == float(metrics[step]["reward/mean"])
                assert "actor/pg_loss" in measured and "rollout_corr/rollout_is_mean" in measured


def check_rebuilt(out: Path, rebuilt: Path) -> None:
    """What `openforge replay rebuild` of the run's archive wrote to ``rebuilt``: as many
    episodes as the run holds (the command itself compares them one by one)."""
    con = open_views(rebuilt)
    assert _count(con, "SELECT count(*) FROM episodes") == _count(
        open_views(run=out), "SELECT count(*) FROM episodes"
    )


# What a rollout pod does not report: its containers' start (the API's timestamps are whole
# seconds) and a final workspace's save (not kept on this backend).
UNMEASURED = {"kubernetes": {"agent_start_s", "verifier_start_s", "save_s", "agent_warm"}}


def _check_costs(out: Path, updates: int) -> None:
    """Every verified rollout's cost (each local rollout measures all of them: its sandboxes
    have cgroups; a pod, all but :data:`UNMEASURED`: its containers read their own cgroups)
    and every step's, each consistent with the others."""
    con = open_views(run=out)
    verified = _count(
        con, "SELECT count(DISTINCT rollout_id) FROM rollouts WHERE phase = 'verified'"
    )

    def unmeasured_by(name: str) -> str:  # the backends that leave ``name`` out, as SQL
        return ", ".join(repr(b) for b, names in UNMEASURED.items() if name in names) or "''"

    missing = " OR ".join(
        f"({name} IS NULL AND backend NOT IN ({unmeasured_by(name)}))"
        for name in COSTS
        if name != "ready_s"
    )
    missing += " OR (ready_s IS NULL AND calls > 0)"  # agent ready: at its first model call
    assert _count(con, "SELECT count(*) FROM rollout_costs") == verified > 0
    assert _count(con, f"SELECT count(*) FROM rollout_costs WHERE {missing}") == 0
    broken = """SELECT count(*) FROM rollout_costs WHERE agent_s + verifier_s + prepare_s > wall_s
        OR agent_cpu_s <= 0 OR agent_peak_mib <= 0 OR model_s > agent_s + 1
        OR (calls > 0 AND tokens_out = 0) OR reward_to_episode_s < 0
        OR ready_s < prepare_s OR ready_s > wall_s"""
    assert _count(con, broken) == 0
    # The train rollouts each update consumed, reached from their reward.
    assert _count(con, "SELECT count(*) FROM rollout_costs WHERE step IS NOT NULL") > 0
    steps = con.sql("SELECT compute_s, wait_s, sync_s, engine_busy, device FROM step_costs")
    rows = steps.fetchall()
    assert len(rows) == updates and all(c > 0 and w >= 0 and s > 0 for c, w, s, *_ in rows), rows
    assert all(b is not None and 0 <= b <= 1 for *_, b, _ in rows), rows  # vLLM was sampled
    assert {d for *_, d in rows} == {"cpu"}
    starts = "SELECT count(*) FROM rollout_costs WHERE agent_start_s >= agent_s"
    assert _count(con, starts) == 0  # a container's start is a part of the agent's time


def check_audit(out: Path, tmp: Path) -> None:
    """`openforge audit`'s page of the run, loaded in headless Chromium: every chart drawn with
    all its marks on screen, but those of what a clean short run has none of."""
    page = html.write(build(out), tmp / "audit.html")
    dom = rendered(page, tmp)
    marks = {str(c["data-chart"]): int(c["data-marks"] or 0) for c in dom.charts}
    assert list(marks) == list(CHART_NAMES)
    empty = {name for name, n in marks.items() if n == 0}
    # A clean run of the raw tiny model: nothing failed, and it may fork or call a tool or not;
    # the main job serves every update (no promotion gate: trainer/promotion.py, serve's option)
    # and injects no fault (no [faults] section).
    quiet = {"fork_classes_by_harness", "failures", "tool_calls", "error_recovery", "promotions",
             "screenshots", "injected_faults"}  # fmt: skip
    assert empty <= quiet, marks
    assert all(c["data-rendered-marks"] == c["data-marks"] for c in dom.charts), dom.charts
    assert dom.no_data == len(empty) and dom.external == []
    assert "bounded by the " in page.read_text()  # the stage that bounded the run is named


def check_resumed(out: Path, output: str) -> None:
    """A rerun of the finished run: resumed from its checkpoint, nothing left to do (nothing
    started), and the archive still holds each event once."""
    assert "resuming after update 2" in output, output[-3000:]
    flat = " ".join(output.split())
    assert "nothing left to do: all 2 updates were made" in flat, output[-3000:]
    assert json.loads((out / "summary.json").read_text())["updates"] == 2
    assert processes_mentioning(str(out)) == []
    con = open_views(run=out)
    pairs = (("completions", "completion"), ("rollouts", "rollout"), ("rewards", "reward"))
    for view, raw in pairs:
        assert _count(con, f"SELECT count(*) FROM raw.{raw}") == _count(
            con, f"SELECT count(*) FROM {view}"
        )


def check_web_run(out: Path, tmp: Path) -> None:
    """What `openforge train examples/web-demo.toml` leaves behind: the main job's checks (its
    held-out tasks are the web tasks'), every rollout verified with calls recorded, and the
    model shown the browser's tools and the task's page from its container."""
    heldout = {t.id for t in load_dataset(WEB_TASKS, split="heldout")}
    assert heldout == {"profile-login", "flight-booking"}
    check_run(out, f"local:{out / 'log'}", per_update=3 * 2, heldout=heldout)
    check_audit(out, tmp)
    results = [json.loads(p.read_text()) for p in out.glob("*/rollouts/*/result.json")]
    assert len(results) == 2 * 6 + 2 * 2  # two updates of 6; evaluations at v0 and v2 of 2
    assert all(r["status"] == "verified" and r["calls"] >= 1 for r in results), results
    with open_reader(f"local:{out / 'log'}", [EVENTS_TOPIC], "web-demo") as reader:
        events = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    calls = [e for e in events if isinstance(e, CompletionEvent)]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model(4096, 0)))  # the run's model
    prompt = tokenizer.decode(calls[0].prompt_token_ids)
    assert "URL: http://127.0.0.1:8765/" in prompt and '"name": "navigate"' in prompt


def check_screenshot_run(out: Path, tmp: Path) -> None:
    """What the web demo on screenshots leaves behind (the tiny VLM, the browser agent showing
    screenshots): the main job's checks, every call's prompt holding its screenshots (named by
    hash, each stored once in the run's image store), every trained sample's images there, the
    trainer's logprobs the engine's (behavior KL near 0, so the LoRA adapter vLLM served after
    each update was the trainer's), and the audit page showing a rollout's screenshots."""
    heldout = {t.id for t in load_dataset(WEB_TASKS, split="heldout")}
    check_run(out, f"local:{out / 'log'}", per_update=3 * 2, heldout=heldout)
    with open_reader(f"local:{out / 'log'}", [EVENTS_TOPIC, EPISODES_TOPIC], "shots") as reader:
        records = [e for rec in reader.poll(100_000, 2.0) for e in decode_message(rec.value)]
    calls = [e for e in records if isinstance(e, CompletionEvent)]
    assert calls and all(e.image_ids for e in calls)  # every observation was a screenshot
    store = ImageStore(out / "log" / "images")
    shots = {sha for e in calls for sha in e.image_ids}
    assert store.usage()[0] == len(shots) and all(store.find(sha) for sha in shots)
    samples = [s for e in records if isinstance(e, Episode) for s in e.samples]
    assert samples and all(s.image_ids and set(s.image_ids) <= shots for s in samples)
    with open(out / "trainer" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(abs(float(r["actor/behavior_kl"])) < 1e-2 for r in rows), rows
    page = html.write(build(out), tmp / "audit.html")
    dom = rendered(page, tmp)
    (gallery,) = [c for c in dom.charts if c["data-chart"] == "screenshots"]
    assert (
        int(gallery["data-marks"] or 0) >= 1
        and gallery["data-rendered-marks"] == (gallery["data-marks"])
    )
