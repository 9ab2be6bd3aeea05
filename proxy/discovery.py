"""What the proxy learns from the upstream at start-up: model name, tokenizer, context length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from proxy.config import ProxyConfig
from schemas.errors import ConfigError


async def discover(config: ProxyConfig) -> tuple[str, Path, int]:
    """Upstream model name, tokenizer directory and context length, from the settings or the
    upstream's ``/v1/models``; a ConfigError says which setting to pass when neither has it."""
    info: dict[str, Any] = {}
    if config.upstream_model is None or config.tokenizer is None or config.max_model_len is None:
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                resp = await client.get(f"{config.upstream_url.rstrip('/')}/v1/models")
                resp.raise_for_status()
                data = resp.json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ConfigError(
                f"cannot list models at {config.upstream_url}/v1/models: {exc}. "
                "Is the upstream running? Or pass --model and --tokenizer."
            ) from exc
        if config.upstream_model is not None:
            data = [m for m in data if m.get("id") == config.upstream_model] or data
        info = data[0] if data else {}
    model = config.upstream_model or info.get("id")
    tokenizer = config.tokenizer or (Path(info["root"]) if info.get("root") else None)
    if not model or tokenizer is None or not tokenizer.is_dir():
        raise ConfigError(
            "cannot tell the upstream model or its tokenizer directory: pass "
            "--model NAME and --tokenizer DIR"
        )
    return model, tokenizer, int(config.max_model_len or info.get("max_model_len") or 4096)
