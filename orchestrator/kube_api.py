"""The Kubernetes API as the rollout backend calls it: the one place where the client's errors
become ours.

Every call goes through :meth:`KubeApi.call`: at most as many at once as the client keeps
connections (less the watch's), each counted, and every failure (an ``ApiException``, or the API
server unreachable) raised as :class:`~schemas.errors.InfrastructureError` naming the call; a
``409 Conflict`` may be asked for as a value instead (``conflict_ok``), for objects that may
exist already. Answers are raw (``_preload_content=False``): their ``.data`` is the JSON text.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

from schemas.errors import InfrastructureError

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


_WRITES = ("create", "delete", "patch", "replace")


class KubeApi:
    """The core and networking APIs of ``api`` (a ``kubernetes.client.ApiClient``)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.net: Any = client.NetworkingV1Api(api)
        # As many calls at once as the client keeps connections (less the watch's): a call
        # beyond that would open (and then drop) a new TLS connection, a handshake each time.
        pool = int(getattr(api.configuration, "connection_pool_maxsize", 32) or 32)
        self._slots = threading.BoundedSemaphore(max(1, pool - 1))
        self.calls = 0  # writes and reads made (the watch's not included)
        self.writes = 0  # of which writes (create, delete, patch, replace)

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        what: str | None = None,
        hint: str = "",
        conflict_ok: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args, **kwargs)``'s raw answer; None for a 409 Conflict when ``conflict_ok``.
        Any other failure is an InfrastructureError naming ``what`` (default: the method's name),
        followed by ``hint``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        what = what or fn.__name__
        self.calls += 1
        self.writes += fn.__name__.startswith(_WRITES)
        try:
            with self._slots:
                return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            if conflict_ok and exc.status == 409:
                return None
            raise InfrastructureError(
                f"Kubernetes API: {what} failed ({exc.status} {exc.reason}): "
                f"{(exc.body or b'')[:300]!r}{hint}"
            ) from exc
        except (HTTPError, OSError) as exc:
            raise InfrastructureError(f"Kubernetes API unreachable ({what}): {exc}{hint}") from exc

    def status(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
        """The HTTP status ``fn(*args, **kwargs)`` answered (an error status is a value here,
        not raised); the API server unreachable is an InfrastructureError."""
        from kubernetes.client.exceptions import ApiException

        try:
            return int(self.call(fn, *args, **kwargs).status)
        except InfrastructureError as exc:
            cause = exc.__cause__
            if isinstance(cause, ApiException):
                return int(cause.status)
            raise

    def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`call`, its answer parsed."""
        return dict(json.loads(self.call(fn, *args, **kwargs).data))

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create ``body``, a core object (an existing one of that name is fine: returned as it
        is)."""
        kind, name = body["kind"], body["metadata"]["name"]
        method = _CAMEL.sub("_", kind).lower()  # ConfigMap -> config_map
        create = getattr(self.core, f"create_namespaced_{method}")
        made = self.call(create, namespace, body, what=f"creating {kind} {name}", conflict_ok=True)
        if made is not None:
            return dict(json.loads(made.data))
        return self.read(getattr(self.core, f"read_namespaced_{method}"), name, namespace)
