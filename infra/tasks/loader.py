"""Load Harbor tasks and datasets, rejecting a malformed task at load time.

    tasks = load_dataset(Path("examples/tasks/manifest.toml"), split=Split.TRAIN)

A dataset is either

- a directory of task directories: every sub-directory that looks like a task (has a task.toml,
  an instruction.md or a tests/ directory) is loaded, in name order, all in the ``train`` split;
  hidden directories are skipped. A directory that is itself a task is a dataset of one, and a
  directory holding a ``manifest.toml`` is that manifest's dataset; or
- a manifest file, TOML (``*.toml``) or JSON lines (``*.jsonl``, ``*.json``), whose entries are
  ``{path, split?, id?}``: ``path`` relative to the manifest's directory (or absolute), ``split``
  ``train`` (the default) or ``heldout``, ``id`` the task's id (default: the directory's name).
  Tasks come in the manifest's order. In TOML the entries are an array of tables::

      [[tasks]]
      path = "write-file"
      split = "train"

  A TOML manifest may also name files its tasks share, copied into each task as it is read
  (``infra.tasks.shared``).

A task is malformed, and :class:`~schemas.errors.TaskError` names the file and the field, when it
lacks ``task.toml``, ``instruction.md`` or ``tests/test.sh``, when task.toml is not valid TOML, or
when a known key has the wrong type. Two tasks with one id in a dataset are an error too.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from infra.tasks import config
from infra.tasks.harbor import steps
from infra.tasks.model import Split, Task
from infra.tasks.shared import place, shared_files
from schemas.errors import TaskError

MANIFEST_KEYS = ("path", "split", "id")
_SPLITS = ", ".join(s.value for s in Split)


def _split(value: Any, where: str) -> Split:
    if not isinstance(value, str) or value not in {s.value for s in Split}:
        raise TaskError(f"{where}: split must be one of {_SPLITS}, got {value!r}")
    return Split(value)


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"{path}: missing; a Harbor task needs {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: cannot read it as UTF-8 text ({exc})") from exc


def parse_task_toml(text: str, file: Path) -> dict[str, Any]:
    """The settings of one task.toml (its text), as :class:`Task` keyword arguments."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{file}: not valid TOML ({exc}); fix the syntax") from exc
    top = config.Section(raw, None, file)
    return {
        "version": top.string("schema_version", top.string("version", "1.0")),
        "metadata": config.metadata(top.table("metadata")),
        "agent": config.agent(top.table("agent")),
        "verifier": config.verifier(top.table("verifier")),
        "environment": config.environment(top.table("environment")),
        "solution_env": top.table("solution").string_table("env"),
        "extra": top.rest(),
    }


def load_task(path: Path, *, task_id: str | None = None, split: Split = Split.TRAIN) -> Task:
    """The task in directory ``path``; see the module doc for what makes it malformed."""
    path = path.resolve()
    if not path.is_dir():
        raise TaskError(f"{path}: not a task directory (it does not exist or is a file)")
    settings = parse_task_toml(_read_text(path / "task.toml", "a task.toml"), path / "task.toml")
    multi_step = "steps" in settings["extra"]
    if multi_step and not (path / "instruction.md").exists():
        instruction = ""  # each step has its own (infra.tasks.harbor.steps checks them)
    else:
        instruction = _read_text(path / "instruction.md", "an instruction.md (the prompt)")
        if not instruction.strip():
            raise TaskError(f"{path / 'instruction.md'}: empty; write the task's prompt in it")
    test_sh = path / "tests" / "test.sh"
    if not test_sh.is_file() and not multi_step:
        raise TaskError(
            f"{test_sh}: missing; a Harbor task needs a verifier script tests/test.sh that "
            "writes /logs/verifier/reward.txt or reward.json"
        )
    task_id = task_id or path.name
    task = Task(id=task_id, path=path, instruction=instruction, split=split, **settings)
    if multi_step:
        first, *_ = steps(task)  # each step's directory and prompt, checked at load
        for step in steps(task):
            if not (step.tests_dir / "test.sh").is_file() and not test_sh.is_file():
                raise TaskError(
                    f"{step.tests_dir / 'test.sh'}: missing, and no shared tests/test.sh"
                )
        task = dataclasses.replace(task, instruction=first.instruction)
    return task


def _looks_like_task(path: Path) -> bool:
    return any((path / name).exists() for name in ("task.toml", "instruction.md", "tests"))


def _entry(raw: Any, where: str, base: Path) -> tuple[Path, Split, str | None]:
    if not isinstance(raw, Mapping):
        raise TaskError(f"{where}: must be a table {{path, split?, id?}}, got {raw!r}")
    unknown = sorted(set(raw) - set(MANIFEST_KEYS))
    if unknown:
        keys = ", ".join(MANIFEST_KEYS)
        raise TaskError(f"{where}: unknown key(s) {unknown}; an entry has only {keys}")
    rel, split, task_id = raw.get("path"), raw.get("split", Split.TRAIN.value), raw.get("id")
    if not isinstance(rel, str) or not rel:
        raise TaskError(f"{where}: path must be the task directory (a string), got {rel!r}")
    if task_id is not None and (not isinstance(task_id, str) or not task_id):
        raise TaskError(f"{where}: id must be a non-empty string, got {task_id!r}")
    task_dir = base / rel
    if not task_dir.is_dir():
        raise TaskError(f"{where}: path {rel!r} is not a task directory ({task_dir} is missing)")
    return task_dir, _split(split, where), task_id


def read_manifest(path: Path) -> list[tuple[Path, Split, str | None]]:
    """The manifest's entries: (task directory, split, id or None), in order."""
    text = _read_text(path, "a manifest")
    if path.suffix == ".toml":
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TaskError(f"{path}: not valid TOML ({exc}); fix the syntax") from exc
        entries = raw.get("tasks")
        if not isinstance(entries, list):
            raise TaskError(f"{path}: tasks must be an array of tables ([[tasks]] path = ...)")
        out = [_entry(e, f"{path}: tasks[{i}]", path.parent) for i, e in enumerate(entries)]
        place(shared_files(raw.get("shared"), path), (task_dir for task_dir, _, _ in out))
        return out
    if path.suffix in (".jsonl", ".json"):
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise TaskError(f"{path}:{n}: not a JSON object ({exc})") from exc
            out.append(_entry(value, f"{path}:{n}", path.parent))
        return out
    raise TaskError(f"{path}: a manifest is a .toml or .jsonl file (or pass a directory)")


def dataset_entries(path: Path) -> Iterator[tuple[Path, Split, str | None]]:
    """The dataset's entries, (task directory, split, id or None), without loading the tasks."""
    if path.is_file():
        yield from read_manifest(path)
    elif (path / "task.toml").exists():
        yield path, Split.TRAIN, None
    elif (path / "manifest.toml").is_file():  # a dataset directory with its manifest
        yield from read_manifest(path / "manifest.toml")
    elif path.is_dir():
        for sub in sorted(path.iterdir()):
            if sub.is_dir() and not sub.name.startswith(".") and _looks_like_task(sub):
                yield sub, Split.TRAIN, None
    else:
        raise TaskError(f"{path}: no such dataset (a directory of tasks or a manifest file)")


def load_dataset(path: Path, split: Split | str | None = None) -> list[Task]:
    """The tasks of the dataset at ``path`` in a stable order: the manifest's, or by directory
    name; only those of ``split`` if given (possibly none). Every task of the dataset is loaded
    and checked, whatever the split, so that a broken task fails the first run that reads it."""
    want = None if split is None else _split(split, f"load_dataset({path})")
    tasks: list[Task] = []
    seen: dict[str, Path] = {}
    for task_dir, task_split, task_id in dataset_entries(path.resolve()):
        task = load_task(task_dir, task_id=task_id, split=task_split)
        if task.id in seen:
            raise TaskError(
                f"{path}: two tasks with id {task.id!r} ({seen[task.id]} and {task.path}); "
                "give one of them another id in the manifest"
            )
        seen[task.id] = task.path
        tasks.append(task)
    return [t for t in tasks if want is None or t.split is want]
