"""A proxy in front of the session's real vLLM server, writing to a local log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.local.vllm import VLLMServer
from openforge.testing.proxy import RunningProxy, proxy_config, running_proxy


@pytest.fixture(scope="module")
def proxy(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("proxy")
    with running_proxy(proxy_config(vllm_server.base_url, Path(tmp), auto_register=True)) as p:
        yield p
