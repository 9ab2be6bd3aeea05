"""``openforge replay rescore``: score a run's saved final workspaces again with a (changed)
verifier, publish the new rewards, and rebuild the episodes whose reward changed.

Per verified rollout of the run (``RUN/rollouts/ID/`` and ``RUN/eval/ID/``) whose task is in the
given task set and whose final workspace was saved (:mod:`orchestrator.final_workspace`):

1. the attempt is laid out afresh under ``RUN/rescore/vN/rollouts/ID/`` (the task's files, its
   Dockerfile's environment), the saved workspace is restored into its workspace and the agent's
   logs are copied back;
2. the task's verifier runs in the task's sandbox (its image's container, or bubblewrap), by the
   orchestrator's own code path
   (:func:`orchestrator.verifier.run_verifier`: ``tests/`` read-only, no network);
3. its reward becomes a :class:`~schemas.reward.RewardEvent` with ``verifier_version`` N,
   appended to the run's event archive (``RUN/archive/record=reward/``), where the reward join
   prefers it over the score recorded when the rollout ran (:func:`pipeline.assembly.reward_order`).

Then the events of the rollouts whose reward (or its components) changed are copied into
``RUN/rescore/vN/events/`` and assembled again by the batch pipeline (``run_replay``) into the
episode archive (default ``RUN/episodes/``: ``episodes/`` and ``deadletter/``), where the rebuilt
episodes (same ids, later ``created_us``) supersede the old ones in ``openforge query`` and in
``openforge replay train``. ``RUN/rescore/vN/report.json`` keeps every rollout's old and new
reward.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra.sandbox import SandboxOutcome
from infra.tasks import Task, harbor, load_dataset
from orchestrator import final_workspace
from orchestrator.environments import Environments
from orchestrator.rundir import RolloutOutcome, RunDir, Status
from orchestrator.verifier import default_phase, run_verifier
from pipeline.assembly import reward_order
from pipeline.jobs import Outputs, RunReport, run_replay
from schemas.archive import ArchiveWriter, read_archive
from schemas.codec import Record
from schemas.completion import CompletionEvent
from schemas.episode import Episode, episode_id_for
from schemas.errors import ConfigError, OpenForgeError
from schemas.reward import RewardEvent
from schemas.rollout import RolloutEvent

# Batch assembly of old events with a new reward: a re-score may come weeks after the rollout,
# and the whole history is at hand, so no reward is late.
REPLAY_LATENESS_S = 10 * 365 * 24 * 3600.0


@dataclass(frozen=True)
class RescoreConfig:
    """Attributes:
    run: the run directory (``openforge rollouts run --out`` or ``openforge train``'s).
    tasks: the task set with the (changed) verifiers; rollouts of other tasks are skipped.
    verifier_version: the new rewards' version (None: one above the highest recorded).
    episodes_out: the episode archive the rebuilt episodes go to (None: the run's archive
        root ``RUN/archive`` where it holds episodes, else ``RUN/episodes``).
    concurrency: verifier sandboxes at once.
    beam_args: Beam options of the rebuild (default: FnApiRunner in this process).
    """

    run: Path
    tasks: Path
    verifier_version: int | None = None
    episodes_out: Path | None = None
    concurrency: int = 2
    beam_args: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.verifier_version is not None and self.verifier_version < 1:
            raise ConfigError(
                f"--verifier-version must be 1 or more (the recorded scores are version 0), "
                f"not {self.verifier_version}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be at least 1, not {self.concurrency}")


@dataclass
class Rescored:
    """One rollout's re-score: the reward the join used before, the new one, or why none."""

    rollout_id: str
    task_id: str
    old_reward: float | None
    new_reward: float | None = None
    old_components: dict[str, float] = field(default_factory=dict)
    new_components: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def changed(self) -> bool:
        """The reward the join uses changed (its components may change without it)."""
        return self.error is None and self.new_reward != self.old_reward

    @property
    def episode_changes(self) -> bool:
        """The episode would differ: its reward or its reward's components changed."""
        return self.changed or (self.error is None and self.new_components != self.old_components)


@dataclass
class RescoreReport:
    version: int
    rescored: list[Rescored]
    skipped: dict[str, str]  # rollout id -> why it was not re-scored
    rebuilt: list[str]  # episode ids rebuilt
    pipeline: RunReport | None
    directory: Path

    def by_task(self) -> list[tuple[str, int, int, int]]:
        """(task, rollouts re-scored, rewards changed, episodes rebuilt), per task."""
        rebuilt = set(self.rebuilt)
        rows: dict[str, tuple[int, int, int]] = {}
        for r in self.rescored:
            n, changed, built = rows.get(r.task_id, (0, 0, 0))
            rows[r.task_id] = (
                n + (r.error is None),
                changed + r.changed,
                built + (episode_id_for(r.rollout_id) in rebuilt),
            )
        return [(task, *counts) for task, counts in sorted(rows.items())]


def _rollouts(run: Path) -> list[tuple[RolloutOutcome, Path]]:
    """Each rollout of ``run`` (a rollouts run or a training run): its outcome and directory."""
    return [
        (outcome, job.rollout_root(outcome.rollout_id))
        for job in RunDir.found_in(run)
        for outcome in job.outcomes()
    ]


def _archive(run: Path) -> Path:
    archive = run / "archive"
    if not (archive / "record=reward").is_dir():
        raise ConfigError(
            f"{run} has no event archive with rewards ({archive}/record=reward/): re-scoring "
            "needs the run's archived events. Pass the run directory of a run that archived "
            "its events."
        )
    return archive


def _current_rewards(archive: Path) -> tuple[dict[str, RewardEvent], int]:
    """The reward the join uses per rollout, and the highest verifier version recorded."""
    best: dict[str, RewardEvent] = {}
    top = 0
    for reward in read_archive(archive, RewardEvent):
        top = max(top, reward.verifier_version or 0)
        held = best.get(reward.rollout_id)
        if held is None or reward_order(reward) > reward_order(held):
            best[reward.rollout_id] = reward
    return best, top


def _tail(path: Path, limit: int = 4000) -> str | None:
    try:
        return path.read_text(errors="replace")[-limit:] or None
    except OSError:
        return None


def rescore_one(
    environments: Environments, task: Task, rollout_dir: Path, root: Path
) -> tuple[float | None, dict[str, float], str | None]:
    """Verify the saved workspace of ``rollout_dir`` again, laid out under ``root``: (reward,
    components, error)."""
    prepared = environments.prepare(task, root)
    workspace = prepared.dirs["workspace"]
    shutil.rmtree(workspace)  # the saved workspace replaces the task's fresh files
    workspace.mkdir()
    final_workspace.restore(rollout_dir, workspace)
    agent_logs = rollout_dir / "logs" / "agent"
    if agent_logs.is_dir():
        shutil.copytree(agent_logs, prepared.dirs["agent_logs"], dirs_exist_ok=True)
    if harbor.steps(task):
        return None, {}, "a multi-step task is not re-scored yet (its steps' states are not saved)"
    own = environments.prepare_verifier(task, root / "verifier-env")
    phase = dataclasses.replace(default_phase(task), own=own)
    run = run_verifier(environments.sandbox(own or prepared), task, root, prepared, phase=phase)
    if run.result.outcome is not SandboxOutcome.EXITED:
        return None, {}, f"the verifier did not finish: {run.result.message}"
    if run.reward.reward is None:
        return None, {}, f"the verifier gave no reward: {run.reward.error}"
    return run.reward.reward, dict(run.reward.components), None


def _events_of(archive: Path, rollouts: set[str]) -> list[Record]:
    out: list[Record] = [r for r in read_archive(archive, RolloutEvent) if r.rollout_id in rollouts]
    out += [r for r in read_archive(archive, CompletionEvent) if r.rollout_id in rollouts]
    out += [r for r in read_archive(archive, RewardEvent) if r.rollout_id in rollouts]
    return out


def rescore(
    cfg: RescoreConfig,
    environments: Environments,
    on_rollout: Callable[[Rescored], None] | None = None,
) -> RescoreReport:
    """Re-score, publish and rebuild (see the module docstring)."""
    archive = _archive(cfg.run)
    tasks = {t.id: t for t in load_dataset(cfg.tasks)}
    current, top = _current_rewards(archive)
    version = _new_version(cfg.verifier_version, top, archive)
    directory = cfg.run / "rescore" / f"v{version}"
    todo, skipped = _select(cfg, tasks, current)

    def one(item: tuple[Task, Path]) -> Rescored:
        done = _rescore_rollout(environments, item, current, directory)
        if on_rollout is not None:
            on_rollout(done)
        return done

    with ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="rescore") as pool:
        rescored = list(pool.map(one, todo))
    _publish(archive, rescored, tasks, version, directory)
    pipeline, rebuilt = _rebuild(cfg, archive, rescored, directory)
    report = RescoreReport(version, rescored, skipped, rebuilt, pipeline, directory)
    _write_report(report, cfg.tasks)
    return report


def _new_version(wanted: int | None, top: int, archive: Path) -> int:
    """The verifier version of the new rewards: ``wanted``, or one above the ``top`` recorded."""
    version = wanted if wanted is not None else top + 1
    if version <= top:
        raise ConfigError(
            f"verifier version {version} is not newer than the {top} already recorded in "
            f"{archive}: the reward join would keep version {top}; pass --verifier-version "
            f"{top + 1} (or leave it out)"
        )
    return version


def _select(
    cfg: RescoreConfig, tasks: dict[str, Task], current: dict[str, RewardEvent]
) -> tuple[list[tuple[Task, Path]], dict[str, str]]:
    """The rollouts to re-score (task, rollout directory), and why each other one is skipped."""
    skipped: dict[str, str] = {}
    todo: list[tuple[Task, Path]] = []
    for outcome, rollout_dir in _rollouts(cfg.run):
        rid, task_id = outcome.rollout_id, outcome.task_id
        if outcome.status is not Status.VERIFIED:
            skipped[rid] = f"not verified ({outcome.status})"
        elif task_id not in tasks:
            skipped[rid] = f"task {task_id!r} is not in {cfg.tasks}"
        elif not (rollout_dir / final_workspace.ARCHIVE).exists():
            note = final_workspace.saved_note(rollout_dir) or {}
            skipped[rid] = str(note.get("reason") or "no saved final workspace")
        elif rid not in current:
            skipped[rid] = "no reward of it in the event archive"
        else:
            todo.append((tasks[task_id], rollout_dir))
    return todo, skipped


def _rescore_rollout(
    environments: Environments,
    item: tuple[Task, Path],
    current: dict[str, RewardEvent],
    directory: Path,
) -> Rescored:
    """One rollout verified again, beside its old reward (an error of its own is kept on it)."""
    task, rollout_dir = item
    rid = rollout_dir.name
    old = current[rid]
    done = Rescored(rid, task.id, old.reward, old_components=dict(old.components))
    try:
        reward, components, error = rescore_one(
            environments, task, rollout_dir, directory / "rollouts" / rid
        )
    except (OSError, OpenForgeError) as exc:  # a task that cannot be laid out, no archive
        reward, components, error = None, {}, str(exc)
    done.new_reward, done.new_components, done.error = reward, components, error
    return done


def _publish(
    archive: Path,
    rescored: list[Rescored],
    tasks: dict[str, Task],
    version: int,
    directory: Path,
) -> None:
    """The new rewards, marked with ``version``, into the run's archive (its durable record)."""
    events = [
        RewardEvent(
            event_id=f"rw-{uuid.uuid4().hex}",
            rollout_id=r.rollout_id,
            reward=r.new_reward,
            at_us=time.time_ns() // 1000,
            task_id=r.task_id,
            components=r.new_components,
            verifier=f"{r.task_id}@{tasks[r.task_id].version}",
            verifier_output=_tail(directory / "rollouts" / r.rollout_id / "verifier.out"),
            verifier_version=version,
        )
        for r in rescored
        if r.error is None and r.new_reward is not None
    ]
    if events:
        ArchiveWriter(archive).write(events)


def _rebuild(
    cfg: RescoreConfig, archive: Path, rescored: list[Rescored], directory: Path
) -> tuple[RunReport | None, list[str]]:
    """The episodes the new rewards change, rebuilt beside the run's: the batch job's report and
    the rebuilt episode ids."""
    changed = {r.rollout_id for r in rescored if r.episode_changes}
    if not changed:
        return None, []
    ArchiveWriter(directory / "events").write(_events_of(archive, changed))
    # Beside the run's episodes: in its one archive root (runs of `openforge train`), or
    # in the episodes/ and deadletter/ roots of the older layout.
    one_root = cfg.episodes_out is None and (archive / "record=episode").is_dir()
    out = archive if one_root else (cfg.episodes_out or cfg.run / "episodes")
    roots = [out] if one_root else [out / "episodes", out / "deadletter"]
    started = time.time_ns() // 1000
    pipeline = run_replay(
        str(directory / "events"),
        Outputs(run_archive=str(out)) if one_root else Outputs(archive=str(out)),
        cfg.beam_args,
        allowed_lateness_s=REPLAY_LATENESS_S,
    )
    wanted = {episode_id_for(rid) for rid in changed}
    rebuilt = {
        e.episode_id
        for root in roots
        for e in read_archive(root, Episode)
        if e.episode_id in wanted and e.created_us >= started
    }
    return pipeline, sorted(rebuilt)


def _write_report(report: RescoreReport, tasks: Path) -> None:
    report.directory.mkdir(parents=True, exist_ok=True)
    body = {
        "verifier_version": report.version,
        "tasks": str(tasks),
        "rescored": [{**asdict(r), "changed": r.changed} for r in report.rescored],
        "skipped": report.skipped,
        "episodes_rebuilt": report.rebuilt,
        "pipeline": report.pipeline.line() if report.pipeline else None,
    }
    (report.directory / "report.json").write_text(json.dumps(body, indent=2) + "\n")
