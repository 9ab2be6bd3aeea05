"""Watch the pods of a label selector: list, then watch from the list's resourceVersion.

The informer pattern, reduced to what the rollout backend needs. One thread:

1. **list** (paged) and hand every pod to ``on_pod`` as ``SYNC``; a pod known before and absent
   now is handed on as ``DELETED`` (it went while nobody watched);
2. **watch** from the list's ``resourceVersion`` (server-side timeout ``watch_timeout_s``, with
   bookmarks); each event is handed on; the stream's end resumes from the last version seen;
3. **410 Gone** (the version was compacted away): list again, which loses nothing, since the
   list is the state and ``on_pod`` is idempotent per pod state;
4. any other failure (the API server restarting, a reset connection): retry with exponential
   backoff, bounded by ``max_backoff_s``, then list again.

Objects are handed on as the API server's JSON (dicts): deserializing into the client's model
classes costs more than the rest of the watch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Pod = dict[str, Any]
OnPod = Callable[[str, Pod], None]  # (event type, pod): SYNC, ADDED, MODIFIED, DELETED


@dataclass
class WatchStats:
    lists: int = 0
    watches: int = 0
    expired: int = 0  # 410 Gone answers (each followed by a list)
    errors: int = 0  # other failures, each retried after a backoff
    events: int = 0  # watch events handed on (bookmarks not counted)


class PodWatcher:
    """Calls ``on_pod`` for every change of the pods in ``namespace`` matching ``selector``."""

    def __init__(
        self,
        api: Any,
        namespace: str,
        selector: str,
        on_pod: OnPod,
        watch_timeout_s: int = 60,
        max_backoff_s: float = 5.0,
        page: int = 500,
    ) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api)
        self.namespace, self.selector = namespace, selector
        self.on_pod = on_pod
        self.watch_timeout_s, self.max_backoff_s, self.page = watch_timeout_s, max_backoff_s, page
        self.stats = WatchStats()
        self.resource_version: str | None = None
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._synced = threading.Event()

    def start(self, resource_version: str | None = None, known: Iterable[str] = ()) -> None:
        """Start watching; from ``resource_version`` if given (a resumed watcher: ``known`` names
        the pods it knew, so that one deleted meanwhile is handed on as deleted), else from a
        fresh list."""
        if self._thread is not None:
            return
        self.resource_version = resource_version
        self._known = set(known)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    @property
    def known(self) -> frozenset[str]:
        """The pods that exist as far as the watcher knows."""
        return frozenset(self._known)

    def wait_synced(self, timeout: float) -> bool:
        """Whether the first list or watch has started (so no later change is missed)."""
        return self._synced.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:  # unblock a read in progress
            with contextlib.suppress(Exception):
                resp.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = 0.1
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self.resource_version = self._list()
                self._synced.set()
                self._stream()
                backoff = 0.1
            except ApiException as exc:
                if exc.status == 410:
                    self.stats.expired += 1
                    log.info(
                        "pod watch expired (410 Gone) at %s: listing again", self.resource_version
                    )
                    self.resource_version = None
                    continue
                backoff = self._failed(exc, backoff)
            except Exception as exc:  # connection reset, API server restarting, ...
                if self._stop.is_set():
                    break
                backoff = self._failed(exc, backoff)

    def _failed(self, exc: BaseException, backoff: float) -> float:
        self.stats.errors += 1
        log.warning("pod watch failed (%s); retrying in %.1fs", exc, backoff)
        self._stop.wait(backoff)
        self.resource_version = None  # what changed meanwhile comes with the next list
        return min(backoff * 2, self.max_backoff_s)

    def _list(self) -> str:
        self.stats.lists += 1
        seen: set[str] = set()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"label_selector": self.selector, "limit": self.page}
            if token:
                kwargs["_continue"] = token
            resp = self.core.list_namespaced_pod(self.namespace, _preload_content=False, **kwargs)
            body = json.loads(resp.data)
            for pod in body.get("items") or []:
                seen.add(pod["metadata"]["name"])
                self.on_pod("SYNC", pod)
            token = body["metadata"].get("continue")
            if not token:
                break
        for gone in self._known - seen:
            self.on_pod("DELETED", {"metadata": {"name": gone, "namespace": self.namespace}})
        self._known = seen
        return str(body["metadata"]["resourceVersion"])

    def _stream(self) -> None:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        self.stats.watches += 1
        resp = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            resource_version=self.resource_version,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            watch=True,
            _preload_content=False,
            _request_timeout=self.watch_timeout_s + 10,
        )
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":  # a Status: 410 Gone when the version was compacted away
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = obj.get("metadata", {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self.stats.events += 1
                    name = obj["metadata"]["name"]
                    if kind == "DELETED":
                        self._known.discard(name)
                    else:
                        self._known.add(name)
                    self.on_pod(kind, obj)
                if version:
                    self.resource_version = str(version)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()
