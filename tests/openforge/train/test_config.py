"""The train config: defaults, descriptions, nearest-key errors, types, overrides, round trips."""

from __future__ import annotations

import dataclasses
import subprocess
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openforge.stack import fault_args
from openforge.train.config import TrainConfig
from openforge.train.config_io import build_config, describe, load_config, to_toml
from schemas.errors import ConfigError
from schemas.faults import FaultKind

ROOT = Path(__file__).resolve().parents[3]


def test_the_demo_config_and_the_defaults_build() -> None:
    cfg = load_config(ROOT / "examples" / "cpu-demo.toml")
    assert cfg.tasks.dataset == str(ROOT / "examples" / "echo-words")
    assert cfg.harness.name == "agent"
    assert build_config({}) == TrainConfig()


def test_every_field_has_a_default_and_a_description() -> None:
    text = describe()
    for section in dataclasses.fields(TrainConfig):
        assert f"[{section.name}]" in text
        for f in dataclasses.fields(getattr(TrainConfig(), section.name)):
            assert f.metadata.get("doc"), f"{section.name}.{f.name} has no description"
            assert f"\n{f.name} = " in text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"trainer": {"lrr": 0.1}}, "unknown key trainer.lrr: did you mean 'lr'?"),
        ({"trainr": {"lr": 0.1}}, "unknown section [trainr]: did you mean 'trainer'?"),
        ({"trainer": {"steps": "ten"}}, "trainer.steps must be a int, not 'ten'"),
        ({"trainer": {"steps": True}}, "trainer.steps must be a int"),
        ({"trainer": {"backend": "gpu"}}, "cpu"),
        ({"trainer": {"steps": 0}}, "trainer.steps must be at least 1"),
        ({"trainer": {"lr": -1.0}}, "trainer.lr must be >= 0"),
        ({"evaluation": {"tasks": -1}}, "evaluation.tasks must be >= 0"),
        ({"rollouts": {"override_memory_mb": -1}}, "rollouts.override_memory_mb must be >= 0"),
        (
            {"rollouts": {"agent_timeout_multiplier": 0.0}},
            "rollouts.agent_timeout_multiplier must be above 0, not 0.0",
        ),
        (
            {"warm_start": {"window": -1}},
            "steps, noisy_steps, window, window_steps, window_max_steps, exact_lr and noisy_lr",
        ),
        ({"warm_start": {"exact_lr": -1e-3}}, "exact_lr and noisy_lr must be >= 0"),
        ({"warm_start": {"window_max_steps": -1}}, "window_max_steps, exact_lr and noisy_lr"),
        ({"rollouts": {"backend": "pods"}}, "choose one of local, kubernetes"),
        (
            {"rollouts": {"backend": "kubernetes"}, "proxy": {"workers": 2}},
            "set proxy.workers = 1",
        ),
        (
            {"rollouts": {"backend": "kubernetes"}, "kubernetes": {"kubeconfig": "/k"}},
            "set kubernetes.proxy_host",
        ),
        (
            {"rollouts": {"backend": "kubernetes"}, "kubernetes": {"cpu_request": 0}},
            "kubernetes.cpu_request = 0",
        ),
        ({"pipeline": {"beam_args": "--runner=X"}}, "pipeline.beam_args must be a list"),
        ({"pipeline": {"reward_weights": ["tests"]}}, "write NAME=WEIGHT"),
        ({"pipeline": {"on_missing_reward": "drop"}}, "unknown pipeline.on_missing_reward"),
        ({"trainer": 3}, "[trainer] must be a table"),
        ({"proxy": {"workers": 0}}, "proxy.workers must be from 1 to 64, not 0"),
        ({"proxy": {"workers": 65}}, "proxy.workers must be from 1 to 64, not 65"),
        ({"proxy": {"workers": "two"}}, "proxy.workers must be a int"),
        ({"proxy": {"extra_args": ["--workers", "2"]}}, "set proxy.workers"),
        (
            {"trainer": {"advantage": "gae"}},
            "unknown trainer.advantage 'gae': choose one of grpo, grpo_vectorized",
        ),
        (
            {"trainer": {"policy_loss": "dro"}},
            "unknown trainer.policy_loss 'dro': choose one of vanilla",
        ),
        ({"harness": {"observation": "video"}}, "choose one of text, screenshot, both"),
        (
            {"harness": {"name": "browser", "observation": "screenshot"}},
            "screenshots need a vision-language model: set model.base = 'tiny-vlm'",
        ),
        (
            {
                "harness": {"observation": "both"},
                "model": {"base": "tiny-vlm"},
                "warm_start": {"recipe": "none"},
            },
            "is for the browser harnesses",
        ),
        ({"model": {"base": "tiny-vlm"}}, "set warm_start.recipe = 'none'"),
        ({"faults": {"rates": {"http_418": 0.1}}}, "unknown fault 'http_418': one of http_500"),
        ({"faults": {"rates": {"http_503": 0.7, "stream_cut": 0.5}}}, "add up to 1.2"),
        (
            {
                "faults": {"rates": {"command_fails_once": 0.5}},
                "rollouts": {"backend": "kubernetes"},
            },
            "the kubernetes backend does not inject sandbox faults",
        ),
        (
            {"warm_start": {"recipe": "harness-traffic", "recovery_fraction": 0.3}},
            "recovery_fraction is the echo-words recipe's",
        ),
        ({"warm_start": {"recovery_fraction": 1.5}}, "recovery_fraction must be within [0, 1]"),
        (
            {
                "harness": {"name": "browser", "observation": "screenshot"},
                "model": {"base": "tiny-vlm"},
                "warm_start": {"recipe": "none"},
                "trainer": {"backend": "verl"},
            },
            "needs trainer.backend = 'cpu'",
        ),
    ],
)
def test_bad_configs_say_what_is_wrong(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert message in str(err.value)


def test_overrides_parse_toml_values_and_bare_words() -> None:
    cfg = build_config(
        {"trainer": {"lr": 0.5}},
        ["trainer.lr=0", "run.output_dir=runs/x", 'pipeline.beam_args=["--runner=PrismRunner"]'],
    )
    assert cfg.trainer.lr == 0.0 and isinstance(cfg.trainer.lr, float)
    assert cfg.run.output_dir == "runs/x"
    assert cfg.pipeline.beam_args == ["--runner=PrismRunner"]
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        build_config({}, ["trainer.lr"])
    with pytest.raises(ConfigError, match="did you mean 'evaluation'"):
        build_config({}, ["evaluaton.every=2"])


def test_a_bad_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer\nlr = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


@given(
    steps=st.integers(1, 10_000),
    lr=st.floats(0, 10, allow_nan=False),
    dir_name=st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=30),
    args=st.lists(st.text(max_size=10).filter(lambda s: "\x00" not in s), max_size=3),
)
def test_the_resolved_config_round_trips_through_toml(
    steps: int, lr: float, dir_name: str, args: list[str]
) -> None:
    cfg = build_config(
        {"trainer": {"steps": steps, "lr": lr}, "run": {"output_dir": dir_name}},
        [],
    )
    cfg.pipeline.beam_args = args
    again = build_config(tomllib.loads(to_toml(cfg)))
    assert again == cfg


def test_the_proxy_workers_flag_is_checked_with_the_config() -> None:
    from typer.testing import CliRunner

    from openforge.cli import app

    result = CliRunner().invoke(app, ["train", "--proxy-workers", "0"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "proxy.workers must be from 1 to 64, not 0" in str(result.exception)
    assert build_config({}, ["proxy.workers=4"]).proxy.workers == 4
    assert TrainConfig().proxy.workers == 1


def test_paths_are_absolute_against_the_file_or_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative paths written in a config mean its directory; ``--set`` ones and defaults mean
    the working directory; ``model.base = "tiny"`` is no path; Kafka URLs stay as they are."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "run.toml").write_text(
        '[tasks]\ndataset = "tasks"\n[event_log]\nurl = "local:log"\n[run]\noutput_dir = "../out"\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg = load_config(Path("../conf/run.toml"))
    assert cfg.tasks.dataset == str(conf / "tasks")
    assert cfg.event_log.url == f"local:{conf / 'log'}"
    assert cfg.run.output_dir == str(tmp_path / "out")
    assert cfg.model.base == "tiny"
    cfg = load_config(Path("../conf/run.toml"), ["run.output_dir=here", "model.base=m"])
    assert cfg.run.output_dir == str(work / "here") and cfg.model.base == str(work / "m")
    cfg = load_config(None, ["event_log.url=kafka://127.0.0.1:9092"])
    assert cfg.event_log.url == "kafka://127.0.0.1:9092"
    assert cfg.tasks.dataset == str(work / "examples" / "echo-words")  # the default
    assert cfg.run.output_dir == str(work / "runs" / "cpu-demo")


def test_the_reward_policy_reaches_the_pipelines_command_line(tmp_path: Path) -> None:
    """What [pipeline] says of rewards is what `openforge pipeline run` is started with, and
    that command takes it (a malformed weight is refused there too, before any job starts)."""
    from openforge.stack import StreamingPipeline

    cfg = build_config(
        {"pipeline": {"reward_weights": ["tests=1", "thumbs=0.5"], "reward_required": ["tests"],
                      "on_missing_reward": "train"}}
    )  # fmt: skip
    job = StreamingPipeline("local:x", tmp_path, 5.0, (), cfg.pipeline.reward_policy())
    argv = job.argv()
    assert argv[argv.index("pipeline") :].count("--reward-required=tests") == 1
    assert "--reward-weight=thumbs=0.5" in argv and "--on-missing-reward=train" in argv
    bad = [*argv[:-1], "--reward-weight=thumbs", "--stop-when-idle=1"]
    done = subprocess.run(bad, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "NAME=WEIGHT" in done.stdout + done.stderr


def test_the_memory_override_reaches_every_task_of_both_splits() -> None:
    """OpenClaw's config raises each task's sandbox to 4 GiB (the tasks declare 1 GiB); the
    main job's leaves the tasks' own."""
    from openforge.train.launch import _split

    for config, memory in [("cpu-demo-openclaw.toml", 4096), ("cpu-demo.toml", 1024)]:
        cfg = load_config(ROOT / "examples" / config)
        for split in (cfg.tasks.train_split, cfg.tasks.heldout_split):
            tasks = _split(cfg, split)
            assert tasks and {t.environment.memory_mb for t in tasks} == {memory}


@pytest.mark.parametrize(
    ("dataset", "name"),
    [
        ("/home/me/openforge/examples/echo-words", "echo-words"),
        ("examples/web-tasks/manifest.toml", "web-tasks"),
        ("echo-words", "echo-words"),
    ],
)
def test_the_curve_is_titled_by_the_task_set_name_not_its_path(dataset: str, name: str) -> None:
    from openforge.train.report import dataset_name

    assert dataset_name(dataset) == name


def test_a_faults_section_is_the_proxys_fault_plan() -> None:
    cfg = build_config({}, ["faults.rates={http_503 = 0.1, stream_cut = 0.05}", "faults.seed=4"])
    plan = cfg.faults.plan()
    assert plan is not None and plan.seed == 4
    assert plan.rates == {FaultKind.HTTP_503: 0.1, FaultKind.STREAM_CUT: 0.05}
    assert TrainConfig().faults.plan() is None  # by default, no fault
    args = fault_args(plan)  # as the run's proxy is started with it
    assert args[:4] == ["--fault", "http_503=0.1", "--fault", "stream_cut=0.05"]
    assert args[args.index("--fault-seed") + 1] == "4"
