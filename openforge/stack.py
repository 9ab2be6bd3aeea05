"""What a rollout job needs running on one machine: vLLM on a model, and the capture proxy on the
embedded event log, listening on a Unix socket that sandboxes reach it through.

    with local_stack(out, needs_model=True, context=65536) as stack:
        ...  # stack.admin (the proxy's admin API), stack.endpoint (for sandboxes), stack.log_url

The admin token is generated here, handed to the proxy process in its environment (never on a
command line) and kept in memory: nothing inside a sandbox can read it. Everything started is
stopped when the block ends, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.local.process import ServiceProcess, free_port
from infra.local.vllm import VLLMServer
from infra.paths import default_tiny_dir
from infra.proxy_client import ProxyAdmin
from infra.sandbox import ProxyEndpoint
from infra.tiny_model import TinyModelSpec, build_tiny_model
from schemas.errors import ServiceError

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


def tiny_model(context: int) -> Path:
    """The tiny model (seed 0) with a ``context``-token window, built once and cached."""
    spec = TinyModelSpec(max_position_embeddings=context)
    return build_tiny_model(default_tiny_dir(0, context), seed=0, spec=spec)


@contextmanager
def proxy_process(
    upstream: str,
    *,
    model: str,
    tokenizer: Path,
    log_url: str,
    out: Path,
    extra_args: Sequence[str] = (),
    unix_socket: Path | None = None,
    ready_timeout: float = 180,
) -> Iterator[ProxyAdmin]:
    """``openforge proxy`` as a process of its own, with a fresh admin token handed over in its
    environment; yields its admin API once it answers (and its Unix socket, if any, exists).
    Logs and spool go under ``out``."""
    token = "ofa_" + secrets.token_urlsafe(32)  # only this process and the proxy know it
    port = free_port()
    argv = [
        sys.executable, "-m", "openforge", "proxy", "--upstream", upstream, "--model", model,
        "--tokenizer", str(tokenizer), "--log", log_url, "--spool", str(out / "spool"),
        "--port", str(port), *extra_args,
    ]  # fmt: skip
    if unix_socket is not None:
        argv += ["--uds", str(unix_socket)]
    proxy = ServiceProcess(
        "proxy", argv, out / "proxy.log", env={**os.environ, "OPENFORGE_ADMIN_TOKEN": token}
    )
    admin = ProxyAdmin(f"http://127.0.0.1:{port}", token)

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


@contextmanager
def local_stack(
    out: Path,
    *,
    needs_model: bool,
    context: int = 4096,
    model_dir: Path | None = None,
    max_tokens_cap: int | None = 512,
    say: Callable[[str], None] = print,
) -> Iterator[Stack]:
    """vLLM (when ``needs_model``) and a proxy writing to ``local:OUT/log``."""
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir or tiny_model(context)
    log_url = f"local:{out / 'log'}"
    socket = out / "proxy.sock"
    with ExitStack() as stack:
        upstream = NO_UPSTREAM
        if needs_model:
            say(f"starting vLLM on {model} ({context}-token context; 20-40 s on CPU)")
            vllm = stack.enter_context(
                VLLMServer(
                    model,
                    served_model_name=SERVED_MODEL,
                    max_model_len=context,
                    enable_lora=False,
                    log_path=out / "vllm.log",
                )
            )
            upstream = vllm.base_url
        extra = ["--max-model-len", str(context)]
        if max_tokens_cap is not None:
            extra += ["--max-tokens-cap", str(max_tokens_cap)]
        admin = stack.enter_context(
            proxy_process(
                upstream,
                model=SERVED_MODEL,
                tokenizer=model,
                log_url=log_url,
                out=out,
                extra_args=extra,
                unix_socket=socket,
                ready_timeout=120,
            )
        )
        say(f"proxy at {admin.url} (sandboxes: {socket}); events in {out / 'log'}")
        yield Stack(
            admin.url,
            admin,
            ProxyEndpoint(socket, SANDBOX_PROXY_PORT),
            log_url,
            model,
            SERVED_MODEL,
        )
