"""The front of a worker pool (``openforge proxy --workers N``): assignment and the admin API.

Served on the proxy's own address (``--port``, ``--uds``), in front of the workers of
:class:`proxy.pool.WorkerPool`:

    POST /admin/rollouts            assign the rollout to a worker (round robin), register it
                                    there; the answer is the worker's, plus ``worker`` (its
                                    index), ``base_url`` (its URL), ``openai_base_url``,
                                    ``anthropic_base_url`` and ``unix_socket``: the harness
                                    talks to that worker directly, with no extra hop
    POST /admin/rollouts/{id}/finish|phase, /rollout/{id}/reward
                                    forwarded to the rollout's worker (a phase or reward of a
                                    rollout no worker has: to worker ``crc32(id) % N``; of an
                                    open-mode session's rollout: its session's worker)
    POST /admin/rollouts/phases     split by owner: each worker gets its rollouts' phases in
                                    one request; the answers joined in the order asked
    POST /sessions/{session}/reward forwarded to the session's worker
    POST /responses/{id}/reward     forwarded to the worker of the rollout the id names
    GET|POST /admin/policy, POST /admin/pause, /admin/resume
                                    sent to every worker at once; the answer sums them
                                    (``in_flight``, ``auto_resumes``), ``paused`` only when
                                    all are, ``version`` the lowest, and ``workers`` lists each
                                    answer. Any worker failing: 502 naming it (the others have
                                    applied it; every one of these is safe to repeat)
    GET  /admin/workers             the workers: ``index``, ``base_url``, ``unix_socket``,
                                    ``restarts`` (by the pool, :mod:`proxy.pool`), ``pid``
    GET  /health                    every worker's health; 503 while any is unavailable or gone
    GET  /metrics                   the front's counters and every worker's metrics with a
                                    ``worker`` label (:mod:`proxy.front_metrics`)
    anything else (calls, models)   forwarded to the owning worker, found by the path's
                                    rollout id or the key (unknown: ``crc32`` of the id,
                                    session header or key), streamed through: one extra hop,
                                    for clients that still use the front's address (counted in
                                    ``openforge_proxy_front_forwarded_total``)

Per-rollout state lives only in its worker. The orchestrator and ``run_rollout`` point each
harness at its worker (``base_url``, or the worker's Unix socket for a sandbox), so their calls
never pass through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from proxy.attribution import request_key, session_identity
from proxy.bodies import parse_json, read_raw
from proxy.config import ProxyConfig
from proxy.credentials import check_admin
from proxy.dialects.base import error_response
from proxy.dialects.registry import dialect_for
from proxy.errors import ProxyError
from proxy.front_metrics import FrontMetrics
from proxy.pool import Worker
from proxy.response_ids import rollout_of

HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
OWNERS_KEPT = 1_000_000  # rollout -> worker entries remembered (oldest forgotten first)


class Front:
    """The front's state: the workers, who owns which rollout and key, one HTTP client."""

    def __init__(self, config: ProxyConfig, workers: list[Worker]) -> None:
        self.config, self.workers = config, workers
        self.owners: OrderedDict[str, int] = OrderedDict()  # rollout id -> worker index
        self.key_owners: dict[str, int] = {}
        self._keys: dict[str, str] = {}  # rollout id -> its key, to forget both together
        self._turn = itertools.count()
        self.metrics = FrontMetrics()
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.upstream_timeout, connect=10),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024),
        )

    def worker_for(self, request: Request) -> Worker:
        """The worker that owns the request's rollout (path id, then key), else by hash."""
        rollout_id = request.path_params.get("rollout_id") or rollout_of(
            request.path_params.get("response_id", "")
        )
        if rollout_id is not None and rollout_id in self.owners:
            return self.workers[self.owners[rollout_id]]
        key = request_key(request)
        if key is not None and key in self.key_owners:
            return self.workers[self.key_owners[key]]
        basis = (
            _session_of(rollout_id)
            or rollout_id
            or request.path_params.get("session")
            or session_identity(request, self.config.session_headers)
            or key
            or ""
        )
        return self.workers[zlib.crc32(basis.encode()) % len(self.workers)]

    def owner_of(self, rollout_id: str) -> Worker:
        """The worker of ``rollout_id``: its owner, else by hash (as :meth:`worker_for`)."""
        if rollout_id in self.owners:
            return self.workers[self.owners[rollout_id]]
        basis = _session_of(rollout_id) or rollout_id
        return self.workers[zlib.crc32(basis.encode()) % len(self.workers)]

    def assign(self, rollout_id: str, index: int, key: str | None) -> None:
        self.owners[rollout_id] = index
        if key:
            self.key_owners[key] = index
            self._keys[rollout_id] = key
        while len(self.owners) > OWNERS_KEPT:  # forgotten: routed by hash (rare, and wrong)
            old, _ = self.owners.popitem(last=False)
            self.key_owners.pop(self._keys.pop(old, ""), None)

    async def send(
        self, worker: Worker, method: str, path: str, request: Request, body: bytes | None
    ) -> httpx.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        try:
            return await self.client.request(
                method, f"{worker.base_url}{path}", content=body, headers=headers
            )
        except httpx.HTTPError as exc:
            raise ProxyError(502, f"proxy worker {worker.index} did not answer: {exc!r}") from exc

    async def broadcast(
        self, request: Request, body: bytes | None
    ) -> list[tuple[Worker, dict[str, Any]]]:
        answers = await asyncio.gather(
            *(self.send(w, request.method, request.url.path, request, body) for w in self.workers)
        )
        for worker, resp in zip(self.workers, answers, strict=True):
            if resp.status_code >= 400:
                raise ProxyError(
                    502 if resp.status_code >= 500 else resp.status_code,
                    f"proxy worker {worker.index} answered {resp.status_code}: {resp.text[:300]}",
                )
        return [(w, dict(r.json())) for w, r in zip(self.workers, answers, strict=True)]


def _relay(resp: httpx.Response) -> Response:
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
    headers.pop("content-encoding", None)
    return Response(resp.content, status_code=resp.status_code, headers=headers)


async def _admin_body(front: Front, request: Request) -> bytes:
    return await read_raw(request, front.config.max_admin_body_bytes, front.config.body_timeout)


async def register(front: Front, request: Request) -> Response:
    raw = await _admin_body(front, request)
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise ProxyError(400, "request body must be a JSON object")
    rollout_id = body.get("rollout_id")
    if rollout_id is None:
        rollout_id = body["rollout_id"] = f"ro-{uuid.uuid4().hex[:16]}"
    if isinstance(rollout_id, str) and rollout_id in front.owners:
        index = front.owners[rollout_id]  # its worker answers 409
    else:
        index = next(front._turn) % len(front.workers)
    worker = front.workers[index]
    resp = await front.send(worker, "POST", "/admin/rollouts", request, json.dumps(body).encode())
    if resp.status_code != 201:
        return _relay(resp)
    answer = dict(resp.json())
    front.assign(answer["rollout_id"], index, answer.get("api_key"))
    front.metrics.registrations.labels(str(index)).inc()
    return JSONResponse(
        {
            **answer,
            "worker": index,
            "base_url": worker.base_url,
            "openai_base_url": worker.base_url + answer["openai_base_path"],
            "anthropic_base_url": worker.base_url + answer["anthropic_base_path"],
            "unix_socket": str(worker.unix_socket) if worker.unix_socket else None,
        },
        status_code=201,
    )


def _session_of(rollout_id: str | None) -> str | None:
    """The session identity of an open-mode session's rollout id (``session-ID`` or
    ``session-ID.MS``, :mod:`proxy.sessions`): its calls went to the worker of that identity.
    An identity that itself ends in ``.`` and digits is taken for a later rollout's id."""
    if rollout_id is None or not rollout_id.startswith("session-"):
        return None
    identity = rollout_id.removeprefix("session-")
    head, dot, tail = identity.rpartition(".")
    return head if dot and tail.isdigit() and head else identity


async def to_owner(front: Front, request: Request) -> Response:
    """An admin route of one rollout, forwarded to its worker."""
    raw = await _admin_body(front, request)
    worker = front.worker_for(request)
    return _relay(await front.send(worker, "POST", request.url.path, request, raw))


async def phases_to_owners(front: Front, request: Request) -> Response:
    """Many phases at once: each worker gets its rollouts' phases in one request (a rollout
    no worker has: by hash, as :meth:`Front.owner_of`); the answer lists them in the order
    asked. Any worker refusing: its answer (the others have recorded theirs; a phase
    recorded twice is one event to consumers)."""
    check_admin(front.config, request_key(request))
    body = parse_json(await _admin_body(front, request))
    items = body.get("phases") if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ProxyError(400, "'phases' must be a list of objects", param="phases")
    shares: dict[int, list[int]] = {}
    for n, item in enumerate(items):
        owner = front.owner_of(str(item.get("rollout_id") or ""))
        shares.setdefault(owner.index, []).append(n)

    async def send(index: int, which: list[int]) -> httpx.Response:
        part = json.dumps({"phases": [items[n] for n in which]}).encode()
        return await front.send(front.workers[index], "POST", request.url.path, request, part)

    answers = await asyncio.gather(*(send(i, which) for i, which in shares.items()))
    out: list[Any] = [None] * len(items)
    for which, resp in zip(shares.values(), answers, strict=True):
        if resp.status_code != 201:
            return _relay(resp)
        for n, answer in zip(which, resp.json()["phases"], strict=True):
            out[n] = answer
    return JSONResponse({"phases": out}, status_code=201)


async def fan_out(front: Front, request: Request) -> Response:
    """Policy version, pause and resume: applied by every worker."""
    raw = await _admin_body(front, request) if request.method == "POST" else None
    answers = await front.broadcast(request, raw)
    dicts = [a for _, a in answers]
    waits = [a["resumes_in_s"] for a in dicts if a.get("resumes_in_s") is not None]
    out: dict[str, Any] = {
        "paused": all(a["paused"] for a in dicts),
        "resumes_in_s": min(waits) if waits else None,
        "auto_resumes": sum(a["auto_resumes"] for a in dicts),
        "in_flight": sum(a["in_flight"] for a in dicts),
        "workers": [{"index": w.index, "base_url": w.base_url, **a} for w, a in answers],
    }
    if "version" in dicts[0]:
        out = {"version": min(a["version"] for a in dicts), **out}
    return JSONResponse(out)


async def workers(front: Front, request: Request) -> Response:
    check_admin(front.config, request_key(request))
    return JSONResponse(
        {
            "workers": [
                {
                    "index": w.index,
                    "base_url": w.base_url,
                    "unix_socket": str(w.unix_socket) if w.unix_socket else None,
                    "restarts": w.restarts,
                    "pid": w.process.pid,
                }
                for w in front.workers
            ]
        }
    )


async def health(front: Front, request: Request) -> Response:
    async def one(worker: Worker) -> dict[str, Any]:
        code = worker.exited()
        if code is not None:
            return {"status": "gone", "problem": f"worker process exited with status {code}"}
        try:
            resp = await front.client.get(f"{worker.base_url}/health", timeout=5)
        except httpx.HTTPError as exc:
            return {"status": "unreachable", "problem": repr(exc)}
        return dict(resp.json())

    answers = await asyncio.gather(*(one(w) for w in front.workers))
    ok = all(a.get("status") == "ok" for a in answers)
    return JSONResponse(
        {
            "status": "ok" if ok else "unavailable",
            "rollouts": sum(a.get("rollouts", 0) for a in answers),
            "finished_rollouts": sum(a.get("finished_rollouts", 0) for a in answers),
            "workers": [
                {"index": w.index, "base_url": w.base_url, "restarts": w.restarts, **a}
                for w, a in zip(front.workers, answers, strict=True)
            ],
        },
        status_code=200 if ok else 503,
    )


async def metrics(front: Front, request: Request) -> Response:
    text = await front.metrics.scrape(front.client, front.workers)
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def forward(front: Front, request: Request) -> Response:
    """A call (or any other route) streamed through to its rollout's worker."""
    worker = front.worker_for(request)
    front.metrics.forwarded.labels(str(worker.index)).inc()
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
    url = f"{worker.base_url}{request.url.path}"
    if request.url.query:
        url += f"?{request.url.query}"
    upstream = front.client.build_request(
        request.method, url, headers=headers, content=request.stream()
    )
    try:
        resp = await front.client.send(upstream, stream=True)
    except httpx.HTTPError as exc:
        raise ProxyError(502, f"proxy worker {worker.index} did not answer: {exc!r}") from exc
    out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
    return StreamingResponse(
        resp.aiter_raw(),
        status_code=resp.status_code,
        headers=out,
        background=BackgroundTask(resp.aclose),
    )


Handler = Callable[[Front, Request], Awaitable[Response]]


def _guard(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request.app.state.front, request)
        except ProxyError as exc:
            return error_response(exc, dialect_for(request.url.path, request.headers))

    return run


def create_front(config: ProxyConfig, pool_workers: list[Worker]) -> Starlette:
    """The front app over started workers (the pool's)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.front = Front(config, pool_workers)
        try:
            yield
        finally:
            await app.state.front.client.aclose()

    everything = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [
        Route("/admin/rollouts", _guard(register), methods=["POST"]),
        Route("/admin/rollouts/phases", _guard(phases_to_owners), methods=["POST"]),
        Route("/admin/rollouts/{rollout_id}/finish", _guard(to_owner), methods=["POST"]),
        Route("/admin/rollouts/{rollout_id}/phase", _guard(to_owner), methods=["POST"]),
        Route("/rollout/{rollout_id}/reward", _guard(to_owner), methods=["POST"]),
        Route("/sessions/{session}/reward", _guard(to_owner), methods=["POST"]),
        Route("/responses/{response_id}/reward", _guard(to_owner), methods=["POST"]),
        Route("/admin/policy", _guard(fan_out), methods=["GET", "POST"]),
        Route("/admin/pause", _guard(fan_out), methods=["POST"]),
        Route("/admin/resume", _guard(fan_out), methods=["POST"]),
        Route("/admin/workers", _guard(workers), methods=["GET"]),
        Route("/health", _guard(health), methods=["GET"]),
        Route("/metrics", _guard(metrics), methods=["GET"]),
        Route("/rollout/{rollout_id}/{rest:path}", _guard(forward), methods=everything),
        Route("/{rest:path}", _guard(forward), methods=everything),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
