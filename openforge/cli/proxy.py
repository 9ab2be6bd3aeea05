"""``openforge proxy``: serve the capture proxy in front of a model server."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from openforge.cli.options import options_command
from openforge.cli.paths import absolute_location
from proxy.chat_template import TemplateEngine
from proxy.config import PauseMode, ProxyConfig, UpstreamKind
from proxy.redaction import RedactionMode
from proxy.render import RenderMode
from schemas.errors import ConfigError
from schemas.faults import ROLLOUT_FAULTS, FaultKind, FaultPlan
from schemas.registry import one_of

# Injected faults (schemas.faults), shared with `openforge rollouts run`.
FAULTS = Annotated[
    list[str] | None,
    typer.Option(
        help="Inject a fault on purpose, KIND=RATE (repeatable), KIND one of "
        f"{one_of(FaultKind)}: a call's (its rate per call), answered as a failing model server "
        "would, or command_fails_once, a rollout's (its rate per rollout: the first command "
        "bash runs in its sandbox fails once); each recorded with what it hit "
        "(docs/rollouts.md).",
    ),
]
FAULT_SEED = Annotated[
    int, typer.Option(help="With --fault: the seed that, with the rollout and call, decides.")
]


@dataclass(frozen=True)
class ProxyOptions:
    """``openforge proxy``'s options: one field per option."""

    upstream: Annotated[
        str, typer.Option(help="Model server base URL (vLLM), e.g. http://127.0.0.1:8000.")
    ]
    log: Annotated[
        str,
        typer.Option(help="Event log: kafka://HOST:PORT or local:DIR.", parser=absolute_location),
    ] = "local:events"
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1"
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8100
    uds: Annotated[
        Path | None,
        typer.Option(help="Also serve on this Unix socket (for sandboxes).", resolve_path=True),
    ] = None
    model: Annotated[str | None, typer.Option(help="Upstream model name (default: its first).")] = (
        None
    )
    tokenizer: Annotated[
        Path | None, typer.Option(help="Tokenizer dir (default: upstream root).", resolve_path=True)
    ] = None
    upstream_kind: Annotated[
        UpstreamKind, typer.Option(help="Upstream endpoint: completions or generate.")
    ] = UpstreamKind.COMPLETIONS
    spool: Annotated[
        Path, typer.Option(help="Spool dir for events while the log is down.", resolve_path=True)
    ] = Path("spool")
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="OPENFORGE_ADMIN_TOKEN",
            help="Token for /admin and rewards (default: generated, see --admin-token-file).",
        ),
    ] = None
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            help="Where a generated admin token is written, mode 0600.", resolve_path=True
        ),
    ] = None
    feedback_token: Annotated[
        str | None,
        typer.Option(
            envvar="OPENFORGE_FEEDBACK_TOKEN",
            help="A token that can post rewards (feedback, by rollout or session) and nothing "
            "else (default: none; the admin token posts rewards too).",
        ),
    ] = None
    auto_register: Annotated[
        bool, typer.Option(help="Register unknown path rollout ids on first use.")
    ] = False
    require_keys: Annotated[bool, typer.Option(help="Path rollouts with a key need it.")] = False
    open_mode: Annotated[
        bool, typer.Option("--open", help="Attribute plain /v1 calls by session.")
    ] = False
    session_header: Annotated[
        list[str] | None, typer.Option(help="Extra session header (open mode).")
    ] = None
    session_idle: Annotated[
        float,
        typer.Option(
            help="Open mode: seconds without a call after which a session's rollout ends "
            "(its next call starts the next one); 0: only an explicit finish ends it."
        ),
    ] = 1800.0
    session_client_header: Annotated[
        str | None,
        typer.Option(
            help="Open mode: a header naming the client (e.g. authorization); a client's new "
            "session ends its previous one if that one has no call in flight (one worker only)."
        ),
    ] = None
    no_bodies: Annotated[
        bool,
        typer.Option(
            help="Leave request/response bodies out of the records (token ids stay: see "
            "docs/proxy.md)."
        ),
    ] = False
    image_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the images in calls are stored by content hash (default: 'images' in "
            "a local log's directory, else beside the spool); proxies of one Kafka log share it.",
            resolve_path=True,
        ),
    ] = None
    redaction: Annotated[
        RedactionMode, typer.Option(help="Secrets in recorded text: mask or off.")
    ] = RedactionMode.MASK
    redact: Annotated[
        list[str] | None,
        typer.Option(help="Also redact this regular expression (repeatable)."),
    ] = None
    redact_file: Annotated[
        Path | None,
        typer.Option(
            help="A file of regular expressions to redact, one a line.", resolve_path=True
        ),
    ] = None
    redact_defaults: Annotated[
        bool, typer.Option(help="Redact the default patterns (API keys, e-mails, ...).")
    ] = True
    max_concurrency: Annotated[int, typer.Option(help="Calls in flight before 429.")] = 256
    policy_version: Annotated[
        int | None,
        typer.Option(
            help="Initial policy version (default: the last one set through /admin/policy, "
            "remembered in the spool dir; else 0)."
        ),
    ] = None
    pause_mode: Annotated[PauseMode, typer.Option(help="During weight swaps: wait or reject.")] = (
        PauseMode.WAIT
    )
    max_model_len: Annotated[
        int | None, typer.Option(help="Context length (default: the upstream's).")
    ] = None
    max_tokens_cap: Annotated[
        int | None, typer.Option(help="Cap on any call's generation budget.")
    ] = None
    finished_rollouts: Annotated[
        int, typer.Option(help="Finished rollouts remembered for late rewards.")
    ] = 10_000
    render_mode: Annotated[
        RenderMode,
        typer.Option(help="Continuations: render a verified window (auto), both (verify), full."),
    ] = RenderMode.AUTO
    template_engine: Annotated[
        TemplateEngine,
        typer.Option(
            help="Chat template: MiniJinja where it renders as the tokenizer's own (auto, "
            "checked), or the tokenizer's own Jinja2 always (jinja2)."
        ),
    ] = TemplateEngine.AUTO
    no_fsync: Annotated[
        bool,
        typer.Option(
            help="Local log: records reach the OS, not the disk, before a call ends "
            "(survives a proxy crash, not a machine crash)."
        ),
    ] = False
    workers: Annotated[
        int,
        typer.Option(
            help="Proxy worker processes; >1: this address assigns rollouts to them and "
            "fans the admin API out (the registration answer's base_url is the worker's)."
        ),
    ] = 1
    worker_port_base: Annotated[
        int | None,
        typer.Option(help="With --workers: worker i listens on this port + i (default: free)."),
    ] = None
    advertise_host: Annotated[
        str | None,
        typer.Option(
            help="With --workers: the host in the workers' base URLs, as harnesses reach them "
            "(default: --host, or this machine's name for 0.0.0.0), e.g. a Service name."
        ),
    ] = None
    fault: FAULTS = None
    fault_seed: FAULT_SEED = 0
    fault_retry_after: Annotated[
        int, typer.Option(help="With --fault: the Retry-After of an injected 429 or 503.")
    ] = 1
    fault_cut_after: Annotated[
        int, typer.Option(help="With --fault stream_cut=R: chunks sent before the cut.")
    ] = 2
    fault_delay: Annotated[
        float, typer.Option(help="With --fault slow_first_byte=R: seconds before the first byte.")
    ] = 3.0


@options_command(ProxyOptions)
def proxy(opts: ProxyOptions) -> None:
    """Serve the capture proxy: harnesses talk to it, it records every call."""
    config = ProxyConfig(
        upstream_url=opts.upstream,
        upstream_model=opts.model,
        upstream_kind=opts.upstream_kind,
        tokenizer=opts.tokenizer,
        log_url=opts.log,
        spool_dir=opts.spool,
        admin_token=opts.admin_token,
        admin_token_file=opts.admin_token_file,
        feedback_token=opts.feedback_token,
        auto_register=opts.auto_register,
        require_keys=opts.require_keys,
        open_mode=opts.open_mode,
        session_idle_timeout=opts.session_idle,
        session_client_header=opts.session_client_header,
        record_bodies=not opts.no_bodies,
        image_dir=opts.image_dir,
        max_concurrency=opts.max_concurrency,
        policy_version=opts.policy_version,
        pause_mode=opts.pause_mode,
        max_tokens_cap=opts.max_tokens_cap,
        max_model_len=opts.max_model_len,
        finished_rollouts=opts.finished_rollouts,
        render_mode=opts.render_mode,
        template_engine=opts.template_engine,
        log_fsync=not opts.no_fsync,
        redaction=opts.redaction,
        redact_patterns=list(opts.redact or []),
        redact_file=opts.redact_file,
        redact_defaults=opts.redact_defaults,
        faults=_faults(opts),
    )
    # The publisher encodes events in a worker thread; a short GIL switch interval keeps that
    # from holding up the event loop (the default 5 ms shows up in p99 latency).
    sys.setswitchinterval(0.0005)
    if opts.session_header:
        config.session_headers = [*opts.session_header, *config.session_headers]
    try:
        _serve(
            config,
            opts.host,
            opts.port,
            opts.uds,
            opts.workers,
            opts.worker_port_base,
            opts.advertise_host,
        )
    except KeyboardInterrupt:  # Ctrl-C is how a user stops a proxy: a clean stop, exit 0
        print("openforge proxy stopped", file=sys.stderr, flush=True)


def _serve(
    config: ProxyConfig,
    host: str,
    port: int,
    uds: Path | None,
    workers: int,
    worker_port_base: int | None,
    advertise_host: str | None,
) -> None:
    """One proxy process, or ``workers`` behind a front, until interrupted."""
    from proxy.app import create_app
    from proxy.serve import serve

    if workers == 1:
        serve(create_app(config), host, port, uds, announce="openforge proxy")
        return
    from proxy.credentials import ensure_admin_token
    from proxy.front import create_front
    from proxy.pool import WorkerPool

    ensure_admin_token(config)  # once, here: every worker gets the same token
    with WorkerPool(
        config, workers, host, uds, worker_port_base, advertise_host=advertise_host
    ) as pool:
        serve(
            create_front(config, pool.workers),
            host,
            port,
            uds,
            announce=f"openforge proxy ({workers} workers)",
        )


def _faults(opts: ProxyOptions) -> FaultPlan | None:
    """The fault plan of ``--fault`` and its settings (None: no fault)."""
    if not opts.fault:
        return None
    plan = FaultPlan.parse(opts.fault, opts.fault_seed)
    if plan.in_sandbox:
        raise ConfigError(
            f"--fault {one_of(ROLLOUT_FAULTS)} is injected by each rollout's sandbox, not by the "
            "proxy: give it to `openforge rollouts run --fault`, or to a training config's faults "
            "section (rates)"
        )
    return dataclasses.replace(
        plan,
        retry_after_s=opts.fault_retry_after,
        cut_after_chunks=opts.fault_cut_after,
        delay_s=opts.fault_delay,
    )
