"""The services a job starts on one machine: vLLM on a model, the capture proxy on an event log
(listening on a Unix socket that sandboxes reach it through), and the streaming pipeline.

    with local_stack(out, needs_model=True, context=65536) as stack:
        ...  # stack.admin (the proxy's admin API), stack.endpoint (for sandboxes), stack.log_url

Each service takes typed options; the proxy's and the pipeline's command lines are built from them
here, in one place each (:func:`proxy_argv`, :meth:`StreamingPipeline.argv`). The admin token is
generated here, handed to the proxy process in its environment (never on a command line) and
kept in memory: nothing inside a sandbox can read it. Everything started is stopped when the
block ends, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infra.local.process import ServiceProcess, free_port
from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.proxy_client import ProxyAdmin
from infra.sandbox import ProxyEndpoint
from infra.tiny_model import TinyModelSpec, build_tiny_model
from pipeline.rewards import RewardPolicy
from schemas.errors import ServiceError
from schemas.faults import ROLLOUT_FAULTS, FaultPlan

SERVED_MODEL = "tiny"
SANDBOX_PROXY_PORT = 8100  # where the proxy appears inside every sandbox
NO_UPSTREAM = "http://127.0.0.1:9"  # the discard port: for harnesses that call no model


@dataclass(frozen=True)
class Stack:
    proxy_url: str
    admin: ProxyAdmin
    endpoint: ProxyEndpoint  # the proxy as sandboxes see it
    log_url: str
    model_dir: Path
    model: str
    vllm: VLLMServer | None = None  # None: no model server (the proxy's upstream is NO_UPSTREAM)


@dataclass(frozen=True)
class ProxyOptions:
    """The ``openforge proxy`` settings a job sets (None: the proxy's default).

    Attributes:
        max_model_len: the context window the proxy checks calls against (tokens).
        max_tokens_cap: the cap on any call's generation budget.
        workers: worker processes; more than one: each rollout's harness calls its own worker.
        host: the address it listens on (and its admin API is reached at): loopback, or an
            address of this machine that a cluster's pods reach.
        faults: the faults it injects into calls on purpose (None: none).
    """

    max_model_len: int | None = None
    max_tokens_cap: int | None = None
    workers: int = 1
    host: str = "127.0.0.1"
    faults: FaultPlan | None = None


@dataclass(frozen=True)
class ModelServer:
    """vLLM's part of a stack.

    Attributes:
        weights: the directory vLLM loads (the base model when LoRA adapters are hot-loaded).
        served_name: the name it serves those weights as (None: the directory's name).
        context: its context window (tokens).
        lora_rank: the largest LoRA adapter rank it can hot-load (None: no adapters).
        images_per_prompt: images a prompt may hold (a vision-language model's
            ``--limit-mm-per-prompt``; 0: vLLM's default).
    """

    weights: Path
    served_name: str | None
    context: int
    lora_rank: int | None = None
    images_per_prompt: int = 0


@dataclass(frozen=True)
class StackSpec:
    """What :func:`serve` starts: vLLM (unless ``vllm`` is None) and the proxy in front of it.

    Attributes:
        out: the services' directory: ``vllm.log``, ``proxy.log``, the proxy's ``spool/`` and
            its socket ``proxy.sock``.
        log_url: the event log the proxy writes to.
        model: the model name harnesses ask for (the proxy's upstream model).
        tokenizer: the tokenizer the proxy renders with.
        vllm: the model server; None for harnesses that call no model, or for ``upstream``.
        proxy: the proxy's settings.
        proxy_args: more ``openforge proxy`` flags, passed as they are.
        ready_timeout: seconds the proxy has to answer once started.
        upstream: the proxy's upstream when ``vllm`` is None (another server in vLLM's format,
            such as the warm start's scripted teacher; the discard port: no model at all).
    """

    out: Path
    log_url: str
    model: str
    tokenizer: Path
    vllm: ModelServer | None
    proxy: ProxyOptions
    proxy_args: tuple[str, ...] = ()
    ready_timeout: float = 180
    upstream: str = NO_UPSTREAM


def tiny_model(context: int, seed: int = 0) -> Path:
    """The tiny model of ``seed`` with a ``context``-token window, built once and cached."""
    spec = TinyModelSpec(max_position_embeddings=context)
    return build_tiny_model(default_tiny_dir(seed, context), seed=seed, spec=spec)


def proxy_argv(
    upstream: str,
    *,
    model: str,
    tokenizer: Path,
    log_url: str,
    spool: Path,
    port: int,
    options: ProxyOptions,
    extra_args: Sequence[str] = (),
    unix_socket: Path | None = None,
) -> list[str]:
    """The ``openforge proxy`` command line: every proxy a job starts is started with this."""
    argv = [
        sys.executable, "-m", "openforge", "proxy", "--upstream", upstream, "--model", model,
        "--tokenizer", str(tokenizer), "--log", log_url, "--spool", str(spool),
        "--port", str(port), "--host", options.host,
    ]  # fmt: skip
    if options.max_model_len is not None:
        argv += ["--max-model-len", str(options.max_model_len)]
    if options.max_tokens_cap is not None:
        argv += ["--max-tokens-cap", str(options.max_tokens_cap)]
    if options.workers != 1:
        argv += ["--workers", str(options.workers)]
    argv += fault_args(options.faults)
    argv += extra_args
    if unix_socket is not None:
        argv += ["--uds", str(unix_socket)]
    return argv


def fault_args(plan: FaultPlan | None) -> list[str]:
    """``openforge proxy``'s options for ``plan``'s call faults (none for no plan; its sandbox
    faults are the orchestrator's)."""
    if plan is None or not plan.active:
        return []
    calls = {k: r for k, r in plan.rates.items() if k not in ROLLOUT_FAULTS}
    return [
        *(a for kind, rate in calls.items() for a in ("--fault", f"{kind}={rate!r}")),
        "--fault-seed", str(plan.seed), "--fault-retry-after", str(plan.retry_after_s),
        "--fault-cut-after", str(plan.cut_after_chunks), "--fault-delay", str(plan.delay_s),
    ]  # fmt: skip


@contextmanager
def proxy_process(
    upstream: str,
    *,
    model: str,
    tokenizer: Path,
    log_url: str,
    out: Path,
    options: ProxyOptions = ProxyOptions(),  # frozen: one shared default is safe
    extra_args: Sequence[str] = (),
    unix_socket: Path | None = None,
    ready_timeout: float = 180,
) -> Iterator[ProxyAdmin]:
    """``openforge proxy`` as a process of its own, with a fresh admin token handed over in its
    environment; yields its admin API once it answers (and its Unix socket, if any, exists).
    Logs and spool go under ``out``."""
    token = "ofa_" + secrets.token_urlsafe(32)  # only this process and the proxy know it
    port = free_port()
    argv = proxy_argv(
        upstream,
        model=model,
        tokenizer=tokenizer,
        log_url=log_url,
        spool=out / "spool",
        port=port,
        options=options,
        extra_args=extra_args,
        unix_socket=unix_socket,
    )
    proxy = ServiceProcess(
        "proxy", argv, out / "proxy.log", env={**os.environ, "OPENFORGE_ADMIN_TOKEN": token}
    )
    admin = ProxyAdmin(f"http://{options.host}:{port}", token)

    def ready() -> bool:
        try:
            admin.health()
        except ServiceError:
            return False
        return unix_socket is None or unix_socket.exists()

    proxy.start()
    try:
        proxy.wait_ready(ready, ready_timeout)
        yield admin
    finally:
        proxy.stop()
        admin.close()


# A Unix socket's path is at most 107 bytes (sun_path); leave room for the kernel's NUL.
MAX_SOCKET_PATH = 100


def _socket_path(out: Path, stack: ExitStack) -> Path:
    """``out/proxy.sock``, or where ``out``'s path is too long for a Unix socket, one in a
    short directory of its own under the temp dir (removed when ``stack`` closes)."""
    socket = out / "proxy.sock"
    if len(os.fsencode(socket)) <= MAX_SOCKET_PATH:
        return socket
    short = Path(tempfile.mkdtemp(prefix="openforge-proxy-"))
    stack.callback(shutil.rmtree, short, ignore_errors=True)
    return short / "proxy.sock"


@contextmanager
def serve(spec: StackSpec, say: Callable[[str], None] = print) -> Iterator[Stack]:
    """vLLM (per ``spec.vllm``) and the proxy in front of it, both stopped when the block ends."""
    spec.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        socket = _socket_path(spec.out, stack)
        vllm: VLLMServer | None = None
        if spec.vllm is not None:
            served = spec.vllm
            context = f"{served.context}-token context"
            say(f"starting vLLM on {served.weights} ({context}; 20-40 s on CPU)")
            vllm = stack.enter_context(
                VLLMServer(
                    served.weights,
                    served_model_name=served.served_name,
                    max_model_len=served.context,
                    enable_lora=served.lora_rank is not None,
                    max_lora_rank=served.lora_rank or 8,
                    log_path=spec.out / "vllm.log",
                    extra_args=(
                        ["--limit-mm-per-prompt", f'{{"image": {served.images_per_prompt}}}']
                        if served.images_per_prompt
                        else []
                    ),
                )
            )
        admin = stack.enter_context(
            proxy_process(
                vllm.base_url if vllm is not None else spec.upstream,
                model=spec.model,
                tokenizer=spec.tokenizer,
                log_url=spec.log_url,
                out=spec.out,
                options=spec.proxy,
                extra_args=spec.proxy_args,
                unix_socket=socket,
                ready_timeout=spec.ready_timeout,
            )
        )
        say(f"proxy at {admin.url} (sandboxes: {socket}); events in {spec.log_url}")
        endpoint = ProxyEndpoint(socket, SANDBOX_PROXY_PORT)
        yield Stack(admin.url, admin, endpoint, spec.log_url, spec.tokenizer, spec.model, vllm)


# The most tokens one call of a local stack generates (harnesses ask for up to 32k; the tiny
# model's answers are noise that need not be long).
LOCAL_MAX_TOKENS = 512


@contextmanager
def local_stack(
    out: Path,
    *,
    needs_model: bool,
    context: int = 4096,
    model_dir: Path | None = None,
    max_tokens_cap: int | None = LOCAL_MAX_TOKENS,
    say: Callable[[str], None] = print,
    faults: FaultPlan | None = None,
) -> Iterator[Stack]:
    """vLLM (when ``needs_model``) serving ``model_dir`` (default: the tiny model) as
    ``SERVED_MODEL``, and a proxy writing to ``local:OUT/log`` (injecting ``faults``)."""
    model = model_dir or tiny_model(context)
    spec = StackSpec(
        out=out,
        log_url=f"local:{out / 'log'}",
        model=SERVED_MODEL,
        tokenizer=model,
        vllm=ModelServer(model, SERVED_MODEL, context) if needs_model else None,
        proxy=ProxyOptions(max_model_len=context, max_tokens_cap=max_tokens_cap, faults=faults),
        ready_timeout=120,
    )
    with serve(spec, say) as stack:
        yield stack


@dataclass(frozen=True)
class StreamingPipeline:
    """``openforge pipeline run``: episodes assembled from the event log as events arrive.

    Attributes:
        source: the event log it reads events from and writes episodes to.
        run_archive: one archive root for the events read, the episodes and the dead letters.
        lateness_s: seconds a rollout's episode waits for its reward.
        beam_args: Beam pipeline options, e.g. ``("--runner=PrismRunner",)``.
        rewards: how a rollout's rewards become its training reward (:mod:`pipeline.rewards`).
    """

    source: str
    run_archive: Path
    lateness_s: float
    beam_args: tuple[str, ...] = ()
    rewards: RewardPolicy = field(default_factory=RewardPolicy)

    def argv(self) -> list[str]:
        """Its command line: every streaming pipeline a job starts is started with this."""
        return [
            sys.executable, "-m", "openforge", "pipeline", "run", "--source", self.source,
            "--run-archive", str(self.run_archive), "--lateness", str(self.lateness_s),
            *[f"--beam-arg={a}" for a in self.beam_args],
            *[f"--reward-weight={n}={w!r}" for n, w in self.rewards.weights.items()],
            *[f"--reward-required={n}" for n in self.rewards.required],
            f"--on-missing-reward={self.rewards.on_missing.value}",
        ]  # fmt: skip


@contextmanager
def pipeline_process(job: StreamingPipeline, log_path: Path) -> Iterator[ServiceProcess]:
    """The pipeline as a process of its own (its output in ``log_path``), stopped on exit."""
    process = ServiceProcess("pipeline", job.argv(), log_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()
