"""Where the API server's CPU goes: a Go CPU profile of the local kube-apiserver (its
``/debug/pprof/profile``, with :data:`FLAGS`; read with the admin's certificate) taken while a
bench runs, and its samples attributed two ways (``go tool pprof -traces``):

- by **request kind**: the handler a sample is under (create, patch, update, delete, delete
  collection, get/list, a watch's delivery), the watch cache's intake of etcd's events, etcd's
  client, Go's garbage collector, TLS and HTTP outside a handler;
- by **mechanism**: the first of JSON, protobuf, TLS/crypto, memory allocation and GC,
  syscalls that a sample is under (JSON is what the Python client speaks: the backend's requests and
  its watch; the control plane's own components speak protobuf).

Used by ``bench.k8s_rollouts --apiserver-profile``.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import threading
import urllib.request
from collections import defaultdict
from pathlib import Path

from infra.local.kube import LocalKube
from schemas.errors import ServiceError, SetupError

FLAGS = ("--profiling=true",)  # the local API server's (LocalKube turns its profiling off)

# (category, substrings of a frame's function name): a sample is in the first category, in this
# order, that any of its frames matches.
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("watch delivery", ("handlers.handleWatch", "handlers.serveWatch", "(*WatchServer).",
                        "(*cacheWatcher).")),
    ("create", ("handlers.CreateResource", "handlers.createHandler", "(*namedCreaterAdapter)")),
    ("patch", ("handlers.PatchResource", "handlers.(*patcher)")),
    ("update", ("handlers.UpdateResource",)),
    ("delete collection", ("handlers.DeleteCollection",)),
    ("delete", ("handlers.DeleteResource",)),
    ("get/list", ("handlers.ListResource", "handlers.GetResource", "handlers.getResourceHandler")),
    ("watch cache intake", ("(*Cacher).", "(*watchCache).", "cacher.(*")),
    ("etcd client", ("go.etcd.io/etcd/client", "google.golang.org/grpc")),
    ("Go GC", ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge")),
    ("filters (authn, authz, audit, limits)", ("endpoints/filters.", "server/filters.")),
    ("TLS, HTTP (outside a handler)", ("crypto/tls", "net/http", "golang.org/x/net/http2")),
]  # fmt: skip
# The same for mechanisms: time under JSON code (its allocations included) is JSON's.
MECHANISMS: list[tuple[str, tuple[str, ...]]] = [
    ("JSON", ("encoding/json", "sigs.k8s.io/json", "json-iterator", "serializer/json",
              "sigs.k8s.io/structured-merge-diff/v4/value", "structured-merge-diff")),
    ("protobuf", ("serializer/protobuf", "gogo/protobuf", ").Unmarshal", ").Marshal",
                  ").MarshalToSizedBuffer")),
    ("TLS/crypto", ("crypto/",)),
    ("allocation and GC", ("runtime.mallocgc", "runtime.gcBgMarkWorker", "runtime.gcDrain",
                           "runtime.scanobject", "runtime.bgsweep", "runtime.memclr")),
    ("syscalls", ("syscall.", "internal/poll.", "runtime.futex", "runtime.epoll")),
]  # fmt: skip
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Profiling:
    """A CPU profile of an API server being taken (:func:`start`)."""

    def __init__(self, url: str, context: ssl.SSLContext, seconds: int, out: Path) -> None:
        self.out = out
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._fetch, args=(url, context, seconds), name="apiserver-profile",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _fetch(self, url: str, context: ssl.SSLContext, seconds: int) -> None:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(url, context=context, timeout=seconds + 60) as resp:
                self.out.write_bytes(resp.read())
        except BaseException as exc:  # handed to the caller by join()
            self._error = exc

    def join(self) -> Path:
        """Wait for the profile; its file (or the error that kept it from being taken)."""
        self._thread.join()
        if self._error is not None:
            raise ServiceError(f"the API server's profile was not taken: {self._error}")
        return self.out


def start(kube: LocalKube, seconds: int, out: Path) -> Profiling:
    """Start taking a ``seconds`` CPU profile of ``kube``'s API server into ``out``."""
    context = ssl.create_default_context(cafile=str(kube.pki / "ca.crt"))
    context.load_cert_chain(str(kube.pki / "admin.crt"), str(kube.pki / "admin.key"))
    return Profiling(f"{kube.server}/debug/pprof/profile?seconds={seconds}", context, seconds, out)


def traces(profile: Path) -> list[tuple[float, list[str]]]:
    """Each sample of ``profile`` as (CPU seconds, its frames from the leaf to the root)."""
    go = shutil.which("go")
    if go is None:
        raise SetupError("reading a Go profile needs the go command (Go 1.26, as scripts/setup)")
    text = subprocess.run(
        [go, "tool", "pprof", "-traces", str(profile)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    samples = []
    for block in re.split(r"\n-+\+-+\n", text)[1:]:
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        head = re.match(r"\s*([\d.]+)(ns|us|µs|ms|s|m|h)\s+(.*)", lines[0])
        if head is None:
            continue
        seconds = float(head.group(1)) * _UNITS[head.group(2)]
        frames = [head.group(3).strip()] + [line.strip() for line in lines[1:]]
        samples.append((seconds, frames))
    return samples


def _category(frames: list[str], table: list[tuple[str, tuple[str, ...]]]) -> str:
    for name, needles in table:
        if any(n in frame for frame in frames for n in needles):
            return name
    return "other"


def summarize(profile: Path, top: int = 12) -> dict[str, object]:
    """The profile's CPU seconds, their shares by request kind, by mechanism and by both (the
    ``top`` pairs), in percent, and its ``top`` functions by their own time."""
    samples = traces(profile)
    total = sum(s for s, _ in samples) or 1.0
    kinds: defaultdict[str, float] = defaultdict(float)
    mechanisms: defaultdict[str, float] = defaultdict(float)
    flat: defaultdict[str, float] = defaultdict(float)
    both: defaultdict[str, float] = defaultdict(float)
    for seconds, frames in samples:
        kind, mechanism = _category(frames, KINDS), _category(frames, MECHANISMS)
        kinds[kind] += seconds
        mechanisms[mechanism] += seconds
        both[f"{kind} / {mechanism}"] += seconds
        flat[frames[0]] += seconds

    def shares(seconds: dict[str, float], n: int | None = None) -> dict[str, float]:
        ordered = sorted(seconds.items(), key=lambda kv: -kv[1])[:n]
        return {k: round(100 * v / total, 1) for k, v in ordered}

    return {
        "cpu_s": round(total, 2),
        "by_request_kind_pct": shares(kinds),
        "by_mechanism_pct": shares(mechanisms),
        "top_kind_and_mechanism_pct": shares(both, top),
        "top_own_time_pct": shares(flat, top),
    }
