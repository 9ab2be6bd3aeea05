"""A small run directory for the audit's tests, in the layout ``openforge train`` writes:
``archive/`` (the events, through the real ``ArchiveWriter``), ``episodes/episodes/`` (the episodes
the real assembly code builds from them, and one dead letter) and ``trainer/`` (``consumed.jsonl``
and ``metrics.csv`` as the trainer writes them). What is in it is known, so tests can say what every
query and chart must show. And the page as headless Chromium renders it."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from infra.image_store import ImageStore, digest
from infra.paths import chromium_binary
from openforge.testing.rollouts import T0, make_rollout
from pipeline.assembly import assemble
from schemas.archive import ArchiveWriter
from schemas.codec import Record
from schemas.completion import CompletionEvent, PolicySpan, Timings
from schemas.enums import Dialect, RolloutPhase
from schemas.episode import Episode
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

HARNESSES = {"codex": Dialect.RESPONSES, "claude-code": Dialect.MESSAGES, "agent": Dialect.CHAT}


def _answer(dialect: Dialect, call_id: str) -> dict[str, object]:
    """A response body with one tool call of id ``call_id``, in ``dialect``."""
    if dialect is Dialect.CHAT:
        call = {"id": call_id, "function": {"name": "bash", "arguments": "{}"}}
        return {"choices": [{"message": {"tool_calls": [call]}}]}
    if dialect is Dialect.RESPONSES:
        return {"output": [{"type": "function_call", "call_id": call_id, "name": "shell"}]}
    return {"content": [{"type": "text"}, {"type": "tool_use", "id": call_id, "name": "Edit"}]}


def _result(dialect: Dialect, call_id: str, text: str) -> dict[str, object]:
    """A request body whose new history is the result of tool call ``call_id``."""
    if dialect is Dialect.CHAT:
        return {"messages": [{"role": "tool", "tool_call_id": call_id, "content": text}]}
    if dialect is Dialect.RESPONSES:
        return {"input": [{"type": "function_call_output", "call_id": call_id, "output": text}]}
    block = {"type": "tool_result", "tool_use_id": call_id, "content": text}
    return {"messages": [{"role": "user", "content": [block]}]}


@dataclass
class SmallRun:
    path: Path
    episodes: list[Episode]  # the trainable ones
    written: list[Episode]  # every episode in the archive (also held-out, dead letter)
    steps: dict[int, list[str]]  # step -> episode ids
    heldout: list[str]  # rollout ids of the held-out evaluation
    unrewarded: list[str]  # rollout ids without a reward
    dead: list[str]  # rollout ids of dead letters


def _version(seed: int) -> int:
    return 0 if seed <= 3 else 1 if seed <= 7 else 2


def _shape(record: Record, seed: int, task: str, group: str, harness: str) -> Record:
    """``make_rollout``'s record as if played by ``harness`` on ``task``: its dialect, policy
    version 0 (rollouts 1-3), 1 (4-7) or 2 (the held-out 8, 9), timings and a tool call in every
    other response body."""
    if isinstance(record, RolloutEvent):
        return replace(record, task_id=task, group_id=group, harness=harness)
    if isinstance(record, RewardEvent):
        return replace(record, task_id=task)
    if not isinstance(record, CompletionEvent):
        return record
    dialect = HARNESSES[harness]
    at = record.timings.received_us
    n = len(record.completion_token_ids)
    i = record.call_index
    # Each even call makes a tool call, the next carries its result: an error for even seeds.
    call_id = f"{record.rollout_id}-t{i}"
    text = "exit code: 1\nstderr:\nNo such file or directory" if seed % 2 == 0 else "exit code: 0"
    previous = f"{record.rollout_id}-t{i - 1}"
    # The chat harness shows the model a screenshot each call (a browser agent's).
    shots = [screenshot(record.rollout_id, k) for k in range(i + 1)] if harness == "agent" else []
    return replace(
        record,
        task_id=task,
        harness=harness,
        dialect=dialect,
        timings=Timings(at, at + 20_000 * (1 + seed % 3), at + 90_000 * (1 + i)),
        policy_versions=[PolicySpan(_version(seed), 0, n)] if n else [],
        response_body=json.dumps(_answer(dialect, call_id)) if i % 2 == 0 else None,
        request_body=json.dumps(_result(dialect, previous, text)) if i % 2 == 1 else None,
        image_ids=[digest(shot) for shot in shots],
        fault="slow_first_byte" if (seed, i) == (3, 1) else None,  # one injected fault
    )


def screenshot(rollout_id: str, call: int) -> bytes:
    """The PNG a call of ``rollout_id`` showed the model: a page with its call number."""
    image = Image.new("RGB", (160, 120), "white")
    ImageDraw.Draw(image).text((10, 10), f"{rollout_id} call {call}", fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _store_screenshots(run: Path, records: list[Record]) -> None:
    """The images of ``records`` in the run's image store (where the proxy puts them)."""
    store = ImageStore(run / "log" / "images")
    for record in records:
        if isinstance(record, CompletionEvent) and record.image_ids:
            store.put(screenshot(record.rollout_id, record.call_index), "image/png")


def verified_costs(seed: int) -> dict[str, float]:
    """What rollout ``seed`` cost, as its orchestrator would have recorded it."""
    agent = 1.0 + 0.5 * seed
    return {
        "queued_s": 0.25 * (seed % 3),
        "prepare_s": 0.25,
        "agent_s": agent,
        "agent_cpu_s": agent / 2,
        "agent_peak_mib": 64.0 + seed,
        "save_s": 0.125,
        "verifier_s": 0.5,
        "wall_s": agent + 1.0,
    }


def _verified(rollout_id: str, seed: int, task: str, group: str, harness: str) -> RolloutEvent:
    return RolloutEvent(
        f"ro_{rollout_id}_verified",
        rollout_id,
        RolloutPhase.VERIFIED,
        T0 + 3 * 10**6 + seed * 10**6,
        task_id=task,
        group_id=group,
        harness=harness,
        backend="local",
        costs=verified_costs(seed),
    )


def write_run(path: Path) -> SmallRun:
    archive, episode_archive = (
        ArchiveWriter(path / "archive"),
        ArchiveWriter(path / "episodes" / "episodes"),
    )
    names = list(HARNESSES)
    episodes: list[Episode] = []
    written: list[Episode] = []
    heldout, unrewarded, dead = [], [], []
    for seed in range(1, 10):
        harness, task = names[seed % 3], f"task-{seed % 4}"
        evaluation = seed >= 8
        group = f"demo-eval-v2-{task}" if evaluation else f"demo-{task}"
        rollout_id = f"ro-{seed}"
        made = make_rollout(seed, rollout_id, calls=5, with_reward=seed != 5)
        records = [_shape(r, seed, task, group, harness) for r in made.records]
        archive.write(records)
        _store_screenshots(path, records)
        if seed == 5:
            unrewarded.append(rollout_id)
            continue
        archive.write([_verified(rollout_id, seed, task, group, harness)])
        episode = assemble(rollout_id, records, created_us=T0 + 10**7 + seed)
        if evaluation:
            heldout.append(rollout_id)
        elif seed == 7:
            episode = replace(episode, dead_letter="reward arrived after the lateness bound")
            dead.append(rollout_id)
        else:
            episodes.append(episode)
        episode_archive.write([episode])
        written.append(episode)
    trainer = path / "trainer"
    trainer.mkdir()
    ids = [e.episode_id for e in episodes]
    steps = {1: ids[:3], 2: ids[3:], 3: ids[1:4]}
    with open(trainer / "consumed.jsonl", "w") as f:
        for step, chosen in steps.items():
            f.write(json.dumps({"step": step, "episodes": chosen}) + "\n")
    fields = ["step", "reward/mean", "policy/version", "rollout_corr/rollout_is_min",
              "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max",
              "promotion/checked", "promotion/promoted", "promotion/candidate_score",
              "promotion/served_score"]  # fmt: skip
    with open(trainer / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for step in steps:
            held = step == 2  # its candidate scored below the served policy
            writer.writerow([step, 0.5, step, 0.8 - 0.1 * step, 1.0, 1.2 + 0.1 * step,
                             1, 0 if held else 1, 0.3 if held else 0.6, 0.5])  # fmt: skip
    return SmallRun(path, episodes, written, steps, heldout, unrewarded, dead)


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> SmallRun:
    return write_run(tmp_path_factory.mktemp("audit") / "run")


class Charts(HTMLParser):
    """The attributes of every ``svg.chart`` of a page, the no-data boxes, external references
    (anything but an in-page anchor or an inline ``data:`` image), and the inline images."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[dict[str, str | None]] = []
        self.no_data = 0
        self.external: list[str] = []
        self.images: list[str] = []  # inline data: URLs of <image> and <img> elements
        self.body: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.charts.append(a)
        if tag == "text" and a.get("class") == "no-data":
            self.no_data += 1
        if tag == "body":
            self.body = a
        link = a.get("src") or a.get("href") or "#"
        if tag in ("image", "img") and link.startswith("data:"):
            self.images.append(link)
        if not link.startswith(("#", "data:")):  # in-page anchors and inline images only
            self.external.append(link)


def rendered(page: Path, tmp: Path) -> Charts:
    """The DOM of ``page`` after Chromium has loaded it and its load handler has run."""
    done = subprocess.run(
        [
            str(chromium_binary()),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp / 'profile'}",
            "--window-size=1200,900",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = Charts()
    parsed.feed(done.stdout)
    assert parsed.body.get("data-measured") == "yes", done.stdout[:2000]  # the script ran
    return parsed
