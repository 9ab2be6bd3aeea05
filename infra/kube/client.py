"""A ``kubernetes.client.ApiClient``: from a kubeconfig, or in a pod from its service account."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from schemas.errors import ConfigError


def api_client(kubeconfig: Path | None = None, pool: int = 64) -> Any:
    """The client for ``kubeconfig`` (default: ``$KUBECONFIG`` or ``~/.kube/config``); inside a
    pod with neither, the pod's service account (``KUBERNETES_SERVICE_HOST``)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    path = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if path is None and not (Path.home() / ".kube" / "config").exists():
        if "KUBERNETES_SERVICE_HOST" not in os.environ:
            raise ConfigError(
                "no Kubernetes cluster configured: pass a kubeconfig (--kubeconfig or "
                "$KUBECONFIG), or run inside a pod; `openforge services up --kube` starts a "
                "local one and prints its kubeconfig"
            )
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path) if path else None, client_configuration=cfg
            )
        except (OSError, config.ConfigException) as exc:
            raise ConfigError(
                f"cannot read the kubeconfig {path or '~/.kube/config'}: {exc}"
            ) from exc
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)
