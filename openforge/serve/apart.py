"""The proxy, the pipeline and the trainer as three processes (:class:`ServicesApart`).

Each is the CLI command a user would run by hand, so what runs here is what runs in a
Deployment: ``openforge proxy --open`` in front of vLLM, ``openforge pipeline run`` from the
proxy's events to episodes (rewards joined by the configured policy), and ``openforge trainer
run --serve-at-start`` from the episodes, hot-loading each update into vLLM and bumping the
proxy's policy version. Any one can be stopped, killed and started again on its own: the proxy
remembers its policy version (``proxy.policy_version``), the pipeline writes each episode once
(``pipeline.sinks``), the trainer resumes from its checkpoint and its consumer group's offsets
(nothing trained twice: ``trainer.checkpoint``). With ``pipeline_workers`` > 1 the pipeline
is that many jobs, each on its share of the partitions (``pipeline.shards``). With
``trainer_ranks`` > 1 the trainer is ``torchrun --nproc_per_node N`` over veRL's FSDP engine
(one rank per GPU; gloo on CPU): rank 0 reads the stream and syncs the weights, every rank
updates (``trainer.ranks``).

The admin and feedback credentials are generated once into ``out`` (mode 0600) and handed to
the processes in their environment, never on a command line.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import httpx

from infra.eventlog.urls import parse_url
from infra.local.process import ServiceProcess
from infra.proxy_client import ProxyAdmin
from schemas.errors import ConfigError, OpenForgeError, ServiceError
from trainer.backends import BackendName
from trainer.promotion import load_prompts


class Service(Enum):
    PROXY = "proxy"
    PIPELINE = "pipeline"
    TRAINER = "trainer"


@dataclass(frozen=True)
class ApartConfig:
    """log_url: the event log all three share (``kafka://HOST:PORT[?partitions=N]``, or
    ``local:DIR`` on one machine); vllm_url: the model server the proxy calls and the trainer
    hot-loads into (started with LoRA enabled); model_dir: the served base model (the trainer's
    starting weights, the proxy's tokenizer); out: credentials, logs, the proxy's spool, the
    trainer's checkpoints and the archive. The reward options are ``openforge pipeline run``'s
    (``NAME=WEIGHT``, required names, ``dead_letter`` or ``train``); ``*_args`` are appended to
    each command line. ``max_staleness``: the trainer drops an episode whose oldest tokens are
    more policy versions behind than this (counted as ``stream/stale_dropped``);
    ``episodes_per_update``: each update waits for that many episodes (a session is its own
    group: live traffic has no task to compare within); None: each takes what is ready.
    ``trainer_backend``: ``cpu`` (the reference, one process) or ``verl``; ``trainer_ranks``:
    processes under torchrun (``verl`` only). ``pipeline_workers``: pipeline jobs, each reading
    its share of the events topic's partitions (``pipeline.shards``; the log needs as many).
    ``judge``: the pipeline scores each finished session with ``judge_model`` (default: the
    first model the server lists: vLLM's base model) on ``judge_url`` (default: the same vLLM,
    called directly, never recorded), a reward named ``judge`` (:mod:`pipeline.judge`) to
    weight or require like the others.
    ``promotion_prompts``: a held-out prompt set (JSONL); each new policy is served only if the
    judge (``judge_model``, else the first model vLLM lists) scores its answers no more than
    ``promotion_max_regression`` below the served policy's (:mod:`trainer.promotion`), each
    answer at most ``promotion_max_tokens`` long."""

    log_url: str
    vllm_url: str
    model_dir: Path
    out: Path
    host: str = "127.0.0.1"
    port: int = 8100
    session_idle_s: float = 1800.0
    lateness_s: float = 3600.0
    reward_weights: tuple[str, ...] = ("feedback=1",)
    reward_required: tuple[str, ...] = ("feedback",)
    on_missing_reward: str = "dead_letter"
    lr: float = 1e-3
    max_staleness: int = 8
    episodes_per_update: int | None = 4
    trainer_backend: BackendName = BackendName.CPU
    trainer_ranks: int = 1
    pipeline_workers: int = 1
    judge: bool = False
    judge_model: str | None = None
    judge_url: str | None = None
    promotion_prompts: Path | None = None
    promotion_max_regression: float = 0.0
    promotion_max_tokens: int = 64
    proxy_args: tuple[str, ...] = ()
    pipeline_args: tuple[str, ...] = ()
    trainer_args: tuple[str, ...] = ()
    python: str = field(default=sys.executable)

    def __post_init__(self) -> None:
        parse_url(self.log_url)  # a bad URL fails here, saying what a good one looks like
        if not self.vllm_url.startswith(("http://", "https://")):
            raise ConfigError(f"vllm_url must be http(s)://HOST:PORT, not {self.vllm_url!r}")
        if self.lateness_s <= self.session_idle_s:
            raise ConfigError(
                f"lateness_s ({self.lateness_s:g}) must exceed session_idle_s "
                f"({self.session_idle_s:g}) plus the longest call: a session's deadline runs "
                "from its events, and it ends only after it has been idle that long"
            )
        self._check_trainer()
        if self.promotion_prompts is not None:
            load_prompts(self.promotion_prompts)  # a bad held-out file fails here
        if (self.judge_model or self.judge_url) and not self.judge and not self.promotion_prompts:
            raise ConfigError("--judge-model and --judge-url choose the judge: add --judge")
        if self.pipeline_workers < 1:
            raise ConfigError(f"pipeline_workers must be at least 1, not {self.pipeline_workers}")
        if not (self.model_dir / "config.json").exists():
            raise ConfigError(
                f"{self.model_dir} holds no model (config.json): pass the directory vLLM serves "
                "(e.g. one `openforge model build-tiny` wrote)"
            )

    def _check_trainer(self) -> None:
        object.__setattr__(self, "trainer_backend", BackendName(self.trainer_backend))
        if self.trainer_ranks < 1:
            raise ConfigError(f"trainer_ranks must be at least 1, not {self.trainer_ranks}")
        if self.trainer_ranks > 1 and self.trainer_backend is not BackendName.VERL:
            raise ConfigError(
                "several trainer ranks need the verl backend (the cpu reference is one "
                "process): pass --trainer-backend verl, or --trainer-ranks 1"
            )

    @property
    def proxy_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _batching(self) -> list[str]:
        n = self.episodes_per_update
        return [] if n is None else ["--groups-per-batch", str(n)]

    def _judge(self) -> list[str]:
        if not self.judge:
            return []
        model = ["--judge-model", self.judge_model] if self.judge_model else []
        return ["--judge-url", self.judge_url or self.vllm_url, *model]

    def _promotion(self) -> list[str]:
        if self.promotion_prompts is None:
            return []
        judge = ["--promotion-judge-model", self.judge_model] if self.judge_model else []
        judge += ["--promotion-judge-url", self.judge_url] if self.judge_url else []
        return [
            "--promotion-prompts", str(self.promotion_prompts),
            f"--promotion-max-regression={self.promotion_max_regression:g}",
            "--promotion-max-tokens", str(self.promotion_max_tokens), *judge,
        ]  # fmt: skip

    def instances(self, service: Service) -> int:
        """How many processes ``service`` runs (the pipeline's workers; one otherwise)."""
        return self.pipeline_workers if service is Service.PIPELINE else 1

    def argv(self, service: Service, index: int = 0) -> list[str]:
        """The command line of ``service``'s process ``index`` (credentials come from the
        environment)."""
        cli = [self.python, "-m", "openforge"]
        if service is Service.PROXY:
            return [
                *cli, "proxy", "--upstream", self.vllm_url, "--log", self.log_url, "--open",
                "--session-idle", f"{self.session_idle_s:g}", "--model", "policy",
                "--tokenizer", str(self.model_dir), "--host", self.host, "--port", str(self.port),
                "--spool", str(self.out / "proxy-spool"), *self.proxy_args,
            ]  # fmt: skip
        if service is Service.PIPELINE:
            rewards = [f"--reward-weight={w}" for w in self.reward_weights] + [
                f"--reward-required={r}" for r in self.reward_required
            ]
            return [
                *cli, "pipeline", "run", "--source", self.log_url,
                "--lateness", f"{self.lateness_s:g}", *rewards,
                "--on-missing-reward", self.on_missing_reward,
                "--archive", str(self.out / "archive"),
                "--worker", f"{index}/{self.pipeline_workers}", *self._judge(),
                *self.pipeline_args,
            ]  # fmt: skip
        if self.trainer_ranks > 1:  # rank 0 leads; every rank updates (trainer.ranks)
            cli = [
                self.python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={self.trainer_ranks}", "-m", "openforge",
            ]  # fmt: skip
        return [
            *cli, "trainer", "run", "--backend", self.trainer_backend.value,
            "--episodes", self.log_url, "--model", str(self.model_dir),
            "--out", str(self.out / "trainer"), "--vllm", self.vllm_url,
            "--proxy", self.proxy_url, "--serve-at-start", "--group-size", "1",
            "--lr", f"{self.lr:g}", "--max-staleness", str(self.max_staleness),
            *self._batching(),
            "--archive", str(self.out / "archive"), *self._promotion(), *self.trainer_args,
        ]  # fmt: skip


def credential(path: Path) -> str:
    """The token in ``path``, generated (mode 0600) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


class ServicesApart:
    """Start, stop, kill and restart the three services one by one (see the module docstring).
    Use as a context manager: every service still running is stopped on exit."""

    def __init__(self, config: ApartConfig) -> None:
        self.config = config
        self.admin_token = credential(config.out / "admin-token")
        self.feedback_token = credential(config.out / "feedback-token")
        self.processes: dict[Service, list[ServiceProcess]] = {}
        self.starts: dict[Service, int] = {s: 0 for s in Service}
        self.admin = ProxyAdmin(config.proxy_url, timeout=5)  # its public routes only

    def __enter__(self) -> ServicesApart:
        return self

    def __exit__(self, *exc: object) -> None:
        for service in reversed(list(self.processes)):
            self.stop(service)
        self.admin.close()

    def start(self, service: Service, ready_s: float = 180.0) -> None:
        """Start ``service`` and wait until it serves: the proxy answers /health; the trainer
        has its starting weights served (vLLM lists the adapter ``policy``)."""
        if service in self.processes:
            raise OpenForgeError(f"{service.value} is running: stop or kill it first")
        self.starts[service] += 1
        env = dict(os.environ)
        env["OPENFORGE_ADMIN_TOKEN"] = self.admin_token
        env["OPENFORGE_FEEDBACK_TOKEN"] = self.feedback_token
        self.processes[service] = []
        for index in range(self.config.instances(service)):
            process = ServiceProcess(
                service.value, self.config.argv(service, index), self._log(service, index), env=env
            )
            process.start()
            self.processes[service].append(process)
        probe = {Service.PROXY: self._proxy_up, Service.TRAINER: self._adapter_served}
        if service in probe:
            self.processes[service][0].wait_ready(probe[service], ready_s)

    def _log(self, service: Service, index: int) -> Path:
        """``logs/SERVICE-START.log``; a pipeline worker's ``logs/pipeline-START.wINDEX.log``."""
        worker = f".w{index}" if self.config.instances(service) > 1 else ""
        return self.config.out / "logs" / f"{service.value}-{self.starts[service]}{worker}.log"

    def stop(self, service: Service) -> None:
        """SIGTERM each of its processes (then SIGKILL after a grace period)."""
        for process in self.processes.pop(service, []):
            process.stop()

    def kill(self, service: Service) -> None:
        """SIGKILL each of its processes' whole process group, as a crash or an evicted pod."""
        for process in self.processes.pop(service):
            if process.pid is not None:
                with suppress(ProcessLookupError):
                    os.killpg(os.getpgid(process.pid), signal.SIGKILL)
            process.stop()

    def exited(self) -> list[Service]:
        """The services a process of which has exited; their other processes are stopped too
        (all forgotten here: start them again)."""
        gone = [s for s, ps in self.processes.items() if any(p.poll() is not None for p in ps)]
        for service in gone:
            self.stop(service)
        return gone

    def check_alive(self) -> None:
        for processes in self.processes.values():
            for process in processes:
                process.check_alive()

    def _proxy_up(self) -> bool:
        try:
            self.admin.health()
        except ServiceError:  # not up yet (refused), or up and not yet healthy (503)
            return False
        return True

    def _adapter_served(self) -> bool:
        try:
            resp = httpx.get(f"{self.config.vllm_url.rstrip('/')}/v1/models", timeout=2)
        except httpx.TransportError:
            return False
        return resp.status_code == 200 and any(m["id"] == "policy" for m in resp.json()["data"])

    def policy_version(self) -> int:
        """The version the proxy stamps now."""
        return self.admin.policy_version()


@contextmanager
def services_apart(config: ApartConfig) -> Iterator[ServicesApart]:
    """The three started in order (proxy, trainer, pipeline), stopped on exit."""
    with ServicesApart(config) as services:
        for service in (Service.PROXY, Service.TRAINER, Service.PIPELINE):
            services.start(service)
        yield services
