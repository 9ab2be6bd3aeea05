"""LiteLLM's proxy as a baseline gateway: installed into its own venv under the cache, started in
front of a vLLM-format upstream, one worker, configured as its docs say (a master key; the
``custom_openai/`` provider, which bridges ``/v1/responses`` and ``/v1/messages`` through the
upstream's ``/v1/chat/completions``).

    with litellm_proxy(upstream="http://127.0.0.1:8200", model="fast", out=tmp) as gw:
        gw.url, gw.key     # POST {gw.url}/v1/chat/completions with "Authorization: Bearer KEY"

The venv (``$OPENFORGE_CACHE/venvs/litellm-VERSION``) is built once (about a minute: pip from
the package index) and reused; a ``.complete`` marker says it finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from infra.local.process import ServiceProcess, free_port
from infra.paths import cache_dir, versions
from schemas.errors import SetupError

VERSION = "1.108.7"  # verified here (platform notes, section 10); 1.107.0 was a compromised release
MASTER_KEY = "sk-openforge-bench"


def litellm_venv(version: str = VERSION) -> Path:
    """The venv with ``litellm[proxy]==version``, built on first use."""
    venv = cache_dir() / "venvs" / f"litellm-{version}"
    if (venv / ".complete").exists():
        return venv
    print(f"installing litellm[proxy]=={version} into {venv} (about a minute)", flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"pip=={versions()['PIP_VERSION']}"],
        [str(venv / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={version}"],
    ]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise SetupError(
                f"installing LiteLLM failed at `{' '.join(argv)}`: {done.stderr[-2000:]}. "
                "Check that the package index is reachable, or pass --no-litellm."
            )
    (venv / ".complete").touch()
    return venv


@dataclass(frozen=True)
class Gateway:
    url: str
    key: str


def _config(upstream: str, model: str) -> str:
    entry = {"model": f"custom_openai/{model}", "api_base": f"{upstream}/v1", "api_key": "none"}
    config = {
        "model_list": [{"model_name": model, "litellm_params": entry}],
        "general_settings": {"master_key": MASTER_KEY},
    }
    return json.dumps(config)  # JSON is YAML: no YAML library needed here


@contextmanager
def litellm_proxy(upstream: str, model: str, out: Path) -> Iterator[Gateway]:
    """LiteLLM's proxy (``--num_workers 1``) routing ``model`` to ``upstream``'s /v1."""
    venv = litellm_venv()
    cfg = out / "litellm.yaml"
    cfg.write_text(_config(upstream, model))
    port = free_port()
    argv = [
        str(venv / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1",
        "--port", str(port), "--num_workers", "1",
    ]  # fmt: skip
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(out), "LITELLM_LOG": "ERROR"}
    proc = ServiceProcess("litellm", argv, out / "litellm.log", env=env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health/liveliness", timeout=2).is_success
        except httpx.HTTPError:
            return False

    proc.start()
    try:
        proc.wait_ready(ready, 180)
        yield Gateway(url, MASTER_KEY)
    finally:
        proc.stop()
