"""Harbor tasks: the examples load, unknown keys are kept, malformed tasks are refused with the
file and the field named, manifests select splits, and verifier outputs read into rewards."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from types import MappingProxyType

import pytest

from infra.tasks import Split, Task, load_dataset, load_task, read_reward
from schemas.errors import ConfigError, TaskError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "tasks"
EXAMPLE_IDS = ["write-file", "fix-failing-test", "csv-summary"]


def make_task(
    root: Path,
    toml: str = "",
    *,
    instruction: str | None = "Do the thing.\n",
    test_sh: bool = True,
    config: bool = True,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config:
        (root / "task.toml").write_text(toml)
    if instruction is not None:
        (root / "instruction.md").write_text(instruction)
    if test_sh:
        (root / "tests").mkdir(exist_ok=True)
        (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


# --- the examples -----------------------------------------------------------------------------


def test_the_examples_load_from_their_manifest() -> None:
    tasks = load_dataset(EXAMPLES / "manifest.toml")
    assert [t.id for t in tasks] == EXAMPLE_IDS
    assert load_dataset(EXAMPLES / "manifest.toml", split=Split.TRAIN) == tasks
    assert load_dataset(EXAMPLES / "manifest.toml", split="heldout") == []
    for task in tasks:
        assert task.split is Split.TRAIN and task.instruction.strip()
        assert task.environment.workdir == "/app" and "/app" in task.instruction
        assert task.environment.allow_internet is False
        assert task.dockerfile == task.path / "environment" / "Dockerfile"
        assert task.solve_script is not None and task.solve_script.is_file()
        assert task.agent.timeout_sec > 0 and task.verifier.timeout_sec > 0
        assert task.metadata.author_name == "OpenForge" and "example" in task.metadata.tags
        assert task.extra == {}
    # The directory holding the manifest is that manifest's dataset.
    assert load_dataset(EXAMPLES) == tasks


@pytest.mark.parametrize("task_id", EXAMPLE_IDS)
def test_example_scripts_are_executable_bash(task_id: str) -> None:
    task = load_task(EXAMPLES / task_id)
    assert task.solve_script is not None
    for script in (task.test_script, task.solve_script):
        assert os.access(script, os.X_OK), f"{script} is not executable (chmod +x)"
        assert script.read_text().startswith("#!/usr/bin/env bash\n")
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    verifier = task.test_script.read_text()
    assert "/logs/verifier/reward" in verifier  # Harbor's absolute paths, not the host's
    assert "/app" in verifier or "/app" in (task.tests_dir / "check_summary.py").read_text()


# --- the task model ---------------------------------------------------------------------------


def test_an_empty_task_toml_gets_harbors_defaults(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t"))
    assert task.id == "t" and task.path == (tmp_path / "t").resolve()
    assert task.instruction == "Do the thing.\n" and task.version == "1.0"
    assert task.agent.timeout_sec == 600.0 and task.verifier.timeout_sec == 600.0
    env = task.environment
    assert (env.build_timeout_sec, env.cpus, env.memory_mb, env.storage_mb) == (600, 1, 2048, 10240)
    assert (env.gpus, env.gpu_types, env.allow_internet, env.docker_image) == (0, None, None, None)
    assert env.workdir == "/app" and task.dockerfile is None and task.solution_dir is None
    assert task.environment_dir is None


def test_unknown_keys_are_kept_read_only(tmp_path: Path) -> None:
    toml = """
version = "1.1"
artifacts = ["/app/out.txt", "/app/log"]
source = "terminal-bench"

[task]
name = "org/example"
keywords = ["a"]

[metadata]
author_name = "A"
expert_time_estimate_min = 10

[agent]
timeout_sec = 30
user = "agent"

[verifier]
env = { TOKEN = "x" }
harden = false

[environment]
docker_image = "ubuntu:24.04"
memory = "2G"
storage = "512M"
memory_mb = 100
skills_dir = "/skills"

[[environment.mcp_servers]]
name = "search"
url = "http://x"

[solution]
env = { SEED = "1" }
"""
    task = load_task(make_task(tmp_path / "t", toml))
    assert task.version == "1.1"
    assert task.extra == {
        "artifacts": ("/app/out.txt", "/app/log"),
        "source": "terminal-bench",
        "task": {"name": "org/example", "keywords": ("a",)},
    }
    assert isinstance(task.extra, MappingProxyType)
    assert task.metadata.extra == {"expert_time_estimate_min": 10}
    assert task.agent.timeout_sec == 30.0 and task.agent.extra == {"user": "agent"}
    assert task.verifier.env == {"TOKEN": "x"} and task.verifier.extra == {"harden": False}
    env = task.environment
    assert env.docker_image == "ubuntu:24.04"
    assert (env.memory_mb, env.storage_mb) == (2048, 512)  # as in Harbor, the strings win
    assert env.extra == {
        "skills_dir": "/skills",
        "mcp_servers": ({"name": "search", "url": "http://x"},),
    }
    assert task.solution_env == {"SEED": "1"}
    with pytest.raises(TypeError):
        task.extra["source"] = "mine"  # type: ignore[index]


def test_environment_paths(tmp_path: Path) -> None:
    root = make_task(tmp_path / "t")
    (root / "environment").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\n")
    task = load_task(root)
    assert task.environment_dir == root.resolve() / "environment"
    assert task.dockerfile == root.resolve() / "environment" / "Dockerfile"
    assert task.solve_script == root.resolve() / "solution" / "solve.sh"
    assert task.test_script == root.resolve() / "tests" / "test.sh"


MALFORMED = [
    # (what, task.toml, make_task options, file named, text in the message)
    ("no instruction", "", {"instruction": None}, "instruction.md", "missing"),
    ("empty instruction", "", {"instruction": "  \n"}, "instruction.md", "empty"),
    ("no verifier", "", {"test_sh": False}, "tests/test.sh", "missing"),
    ("no task.toml", "", {"config": False}, "task.toml", "missing"),
    ("bad TOML", "[agent\ntimeout_sec = 1", {}, "task.toml", "not valid TOML"),
    (
        "timeout a word",
        '[verifier]\ntimeout_sec = "ten"',
        {},
        "task.toml",
        "[verifier] timeout_sec",
    ),
    ("negative timeout", "[agent]\ntimeout_sec = -1", {}, "task.toml", "[agent] timeout_sec"),
    ("cpus a bool", "[environment]\ncpus = true", {}, "task.toml", "[environment] cpus"),
    ("cpus a float", "[environment]\ncpus = 1.5", {}, "task.toml", "[environment] cpus"),
    ("bad memory", '[environment]\nmemory = "lots"', {}, "task.toml", "[environment] memory"),
    ("internet a word", '[environment]\nallow_internet = "no"', {}, "task.toml", "allow_internet"),
    ("relative workdir", '[environment]\nworkdir = "app"', {}, "task.toml", "an absolute path"),
    ("env not strings", "[verifier]\nenv = { A = 1 }", {}, "task.toml", "[verifier] env"),
    ("tags a string", '[metadata]\ntags = "x"', {}, "task.toml", "[metadata] tags"),
    ("metadata a string", 'metadata = "x"', {}, "task.toml", "[metadata] must be a table"),
    ("version a number", "version = 1.0", {}, "task.toml", "version must be a string"),
]


@pytest.mark.parametrize(
    ("toml", "options", "file", "text"),
    [m[1:] for m in MALFORMED],
    ids=[m[0] for m in MALFORMED],
)
def test_a_malformed_task_is_refused_naming_file_and_field(
    tmp_path: Path, toml: str, options: dict[str, object], file: str, text: str
) -> None:
    root = make_task(tmp_path / "t", toml, **options)  # type: ignore[arg-type]
    with pytest.raises(TaskError) as err:
        load_task(root)
    message = str(err.value)
    assert str(root.resolve() / file) in message and text in message, message
    assert isinstance(err.value, ConfigError)


# --- datasets and manifests -------------------------------------------------------------------


def test_manifest_selects_splits_in_its_order(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        make_task(tmp_path / "tasks" / name)
    (tmp_path / "sets").mkdir()
    toml = tmp_path / "sets" / "all.toml"
    toml.write_text(
        '[[tasks]]\npath = "../tasks/c"\nsplit = "heldout"\n'
        '[[tasks]]\npath = "../tasks/a"\nid = "alpha"\n'
        f'[[tasks]]\npath = "{tmp_path / "tasks" / "b"}"\nsplit = "train"\n'
    )
    assert [(t.id, t.split) for t in load_dataset(toml)] == [
        ("c", Split.HELDOUT),
        ("alpha", Split.TRAIN),
        ("b", Split.TRAIN),
    ]
    assert [t.id for t in load_dataset(toml, split="train")] == ["alpha", "b"]
    assert [t.id for t in load_dataset(toml, split=Split.HELDOUT)] == ["c"]

    jsonl = tmp_path / "sets" / "all.jsonl"
    jsonl.write_text(
        '{"path": "../tasks/b", "split": "heldout"}\n\n{"path": "../tasks/a", "id": "alpha"}\n'
    )
    got = [(t.id, t.split) for t in load_dataset(jsonl)]
    assert got == [("b", Split.HELDOUT), ("alpha", Split.TRAIN)]
    with pytest.raises(TaskError, match="split must be one of train, heldout"):
        load_dataset(jsonl, split="test")


@pytest.mark.parametrize(
    ("manifest", "body", "text"),
    [
        ("m.toml", '[[tasks]]\npath = "a"\nsplit = "dev"', "tasks[0]: split must be one of"),
        ("m.toml", '[[tasks]]\npath = "a"\nspilt = "train"', "unknown key(s) ['spilt']"),
        ("m.toml", "[[tasks]]\npath = 3", "tasks[0]: path must be"),
        ("m.toml", 'tasks = "a"', "tasks must be an array of tables"),
        (
            "m.toml",
            '[[tasks]]\npath = "missing"',
            "tasks[0]: path 'missing' is not a task directory",
        ),
        ("m.jsonl", '{"path": "a"}\n{"path": "a"}', "two tasks with id 'a'"),
        ("m.jsonl", '{"path": "a"}\nnot json', "m.jsonl:2: not a JSON object"),
        ("m.yaml", "- a", "a manifest is a .toml or .jsonl file"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_entry(
    tmp_path: Path, manifest: str, body: str, text: str
) -> None:
    make_task(tmp_path / "a")
    (tmp_path / manifest).write_text(body)
    with pytest.raises(TaskError) as err:
        load_dataset(tmp_path / manifest)
    assert text in str(err.value) and manifest in str(err.value), str(err.value)


def test_a_directory_dataset_finds_tasks_and_reports_broken_ones(tmp_path: Path) -> None:
    make_task(tmp_path / "b")
    make_task(tmp_path / "a")
    (tmp_path / ".cache").mkdir()
    (tmp_path / "notes").mkdir()  # not a task: skipped
    assert [t.id for t in load_dataset(tmp_path)] == ["a", "b"]
    assert [t.id for t in load_dataset(tmp_path / "a")] == ["a"]  # a task is a dataset of one
    make_task(tmp_path / "c", instruction=None)
    with pytest.raises(TaskError, match=r"c/instruction\.md: missing"):
        load_dataset(tmp_path)
    with pytest.raises(TaskError, match="no such dataset"):
        load_dataset(tmp_path / "nowhere")


# --- verifier output --------------------------------------------------------------------------


def _reward(tmp_path: Path, files: dict[str, str]) -> tuple[float | None, dict[str, float], str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = read_reward(tmp_path)
    assert (got.reward is None) == (got.error is not None) == (not got.ok)
    return got.reward, dict(got.components), got.error or ""


@pytest.mark.parametrize(
    ("files", "reward", "components"),
    [
        ({"reward.txt": "1\n"}, 1.0, {"reward": 1.0}),
        ({"reward.txt": "  0.25 "}, 0.25, {"reward": 0.25}),
        (
            {"reward.json": '{"reward": 1.0, "tests_passed": 3}'},
            1.0,
            {"reward": 1, "tests_passed": 3},
        ),
        ({"reward.json": '{"score": 0.5}'}, 0.5, {"score": 0.5}),
        ({"reward.json": '{"reward": 0.0}', "reward.txt": "1"}, 0.0, {"reward": 0.0}),
    ],
)
def test_reward_files(
    tmp_path: Path, files: dict[str, str], reward: float, components: dict[str, float]
) -> None:
    assert _reward(tmp_path, files) == (reward, components, "")


@pytest.mark.parametrize(
    ("files", "text"),
    [
        ({}, "neither reward.json nor reward.txt"),
        ({"reward.txt": "passed"}, "must hold one number"),
        ({"reward.txt": "nan"}, "must be finite"),
        ({"reward.txt": "-inf"}, "must be finite"),
        ({"reward.json": '{"a": 1, "b": 0}'}, "no 'reward' key"),
        ({"reward.json": '{"reward": NaN}'}, "finite numbers"),
        ({"reward.json": '{"reward": true}'}, "finite numbers"),
        ({"reward.json": '{"reward": "1"}'}, "finite numbers"),
        ({"reward.json": '{"reward": 1' + "0" * 400 + "}"}, "finite numbers"),
        ({"reward.json": "[1]"}, "non-empty JSON object"),
        ({"reward.json": "{}"}, "non-empty JSON object"),
        ({"reward.json": "{", "reward.txt": "1"}, "not readable as JSON"),  # no fall-back
    ],
)
def test_bad_reward_files_are_an_error_value(
    tmp_path: Path, files: dict[str, str], text: str
) -> None:
    reward, components, error = _reward(tmp_path, files)
    assert reward is None and components == {}
    assert text in error and str(tmp_path) in error, error


def test_example_reward_json_shape_reads(tmp_path: Path) -> None:
    """The csv-summary checker's output format reads into a reward and its components."""
    out = {"reward": 0.75, "fields_right": 3, "fields_total": 4}
    (tmp_path / "reward.json").write_text(json.dumps(out))
    got = read_reward(tmp_path)
    assert got.reward == 0.75 and got.components == {k: float(v) for k, v in out.items()}
    assert got.source == tmp_path / "reward.json" and math.isfinite(got.reward)


def test_task_is_frozen(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "t"))
    with pytest.raises(AttributeError):
        task.id = "other"  # type: ignore[misc]
    assert isinstance(task, Task)
