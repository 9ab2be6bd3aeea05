"""The command lines of the services a job starts, built from typed options in one place each,
are ones the ``openforge`` CLI parses into those same options; the train config maps onto them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from infra.harnesses import Agent
from openforge.cli import app
from openforge.stack import ModelServer, ProxyOptions, StreamingPipeline, proxy_argv
from openforge.train.config import POLICY
from openforge.train.config_io import build_config
from openforge.train.launch import Launch
from openforge.train.specs import pipeline_job, stack_spec


def _parsed(argv: list[str]) -> dict[str, Any]:
    """The parameters ``openforge`` would call the command with (parsed, not run)."""
    assert argv[:3] == [sys.executable, "-m", "openforge"]
    command: Any = typer.main.get_command(app)
    args = argv[3:]
    with command.make_context("openforge", list(args), resilient_parsing=True) as ctx:
        while hasattr(command, "get_command"):  # a group: descend into the named command
            command, args = command.get_command(ctx, args[0]), args[1:]
            assert command is not None, argv
        with command.make_context(command.name, list(args), parent=ctx) as sub:
            return dict(sub.params)


def test_the_proxy_argv_carries_every_option(tmp_path: Path) -> None:
    options = ProxyOptions(max_model_len=8192, max_tokens_cap=64, workers=3)
    argv = proxy_argv(
        "http://127.0.0.1:8000",
        model="policy",
        tokenizer=tmp_path / "model",
        log_url="kafka://127.0.0.1:9092",
        spool=tmp_path / "spool",
        port=8123,
        options=options,
        extra_args=["--max-concurrency", "7"],
        unix_socket=tmp_path / "proxy.sock",
    )
    params = _parsed(argv)
    assert (params["max_model_len"], params["max_tokens_cap"], params["workers"]) == (8192, 64, 3)
    assert params["upstream"] == "http://127.0.0.1:8000" and params["model"] == "policy"
    assert params["log"] == "kafka://127.0.0.1:9092" and params["port"] == 8123
    assert params["uds"] == tmp_path / "proxy.sock" and params["max_concurrency"] == 7
    defaults = _parsed(
        proxy_argv(
            "http://127.0.0.1:9",
            model="tiny",
            tokenizer=tmp_path,
            log_url="local:log",
            spool=tmp_path,
            port=1,
            options=ProxyOptions(),
        )
    )
    assert defaults["max_model_len"] is None and defaults["max_tokens_cap"] is None
    assert defaults["workers"] == 1 and defaults["uds"] is None


def test_the_pipeline_argv_carries_every_option(tmp_path: Path) -> None:
    log = f"local:{tmp_path / 'log'}"
    job = StreamingPipeline(log, tmp_path / "archive", 12.5, ("--runner=FnApiRunner",))
    params = _parsed(job.argv())
    assert params["source"] == log and params["run_archive"] == str(tmp_path / "archive")
    assert params["lateness"] == 12.5 and params["beam_arg"] == ["--runner=FnApiRunner"]


def test_the_train_config_becomes_the_pipeline_job(tmp_path: Path) -> None:
    cfg = build_config(
        {"pipeline": {"lateness_s": 5.0, "beam_args": ["--runner=PrismRunner", "--x=1"]}}
    )
    job = pipeline_job(cfg, tmp_path, "kafka://h:1")
    assert job == StreamingPipeline(
        "kafka://h:1", tmp_path / "archive", 5.0, ("--runner=PrismRunner", "--x=1")
    )


def _launch(tmp_path: Path) -> Launch:
    images = tmp_path / "log" / "images"
    return Launch(
        "l1", [], [], Agent(), tmp_path / "warm", "local:log", tmp_path / "v3", 3, 3, images
    )


def test_the_train_config_becomes_the_stack(tmp_path: Path) -> None:
    overrides = ["proxy.workers=2", "proxy.max_tokens_cap=99", "model.context=2048"]
    cfg = build_config({"proxy": {"extra_args": ["--no-bodies"]}}, overrides)
    spec = stack_spec(cfg, tmp_path, _launch(tmp_path))
    assert spec.out == tmp_path / "services" and spec.model == POLICY
    assert spec.tokenizer == tmp_path / "warm" and spec.log_url == "local:log"
    assert spec.proxy == ProxyOptions(max_model_len=2048, max_tokens_cap=99, workers=2)
    # The run's proxy stores the images of calls where the trainer reads them.
    assert spec.proxy_args == ("--no-bodies", "--image-dir", str(tmp_path / "log" / "images"))
    # LoRA: vLLM loads the warm-started model and hot-loads the policy adapter.
    assert spec.vllm == ModelServer(tmp_path / "warm", None, 2048, 8)
    # Full weights: vLLM serves the first weights themselves, under the policy's name.
    full = stack_spec(build_config({}, ["trainer.lora_rank=0"]), tmp_path, _launch(tmp_path))
    assert full.vllm == ModelServer(tmp_path / "v3", POLICY, 4096, None)
    # Screenshots: the tiny VLM, one image allowed per turn and the first page.
    shots = ["model.base=tiny-vlm", "harness.name=browser", "harness.observation=screenshot"]
    vlm = build_config({"warm_start": {"recipe": "none"}}, [*shots, "harness.max_turns=3"])
    assert stack_spec(vlm, tmp_path, _launch(tmp_path)).vllm == ModelServer(
        tmp_path / "warm", None, 4096, 8, images_per_prompt=4
    )
