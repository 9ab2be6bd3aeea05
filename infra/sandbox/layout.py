"""What the bubblewrap sandbox's file tree holds, and what would fail to start, decided on the host.

The tree is, in mount order: the host's system directories read-only (symlinks such as ``/bin ->
usr/bin`` kept as symlinks), the masked credential files, ``/proc``, ``/dev``, a tmpfs ``/tmp``
and a tmpfs home, with a proxy the forwarder's Python installation, and then the spec's mounts
(a later, deeper mount wins). :func:`cannot_start` resolves the command in that tree (``PATH`` or
``cwd``) before anything starts, so a missing binary is reported without starting a sandbox.
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys

from infra.sandbox.base import SandboxSpec

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def system_args() -> list[str]:
    """bwrap arguments for the host's system directories, read-only, and the masks."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for f in MASKED:  # a device node on a nodev mount: opening it fails with EACCES
        if os.path.exists(f):
            args += ["--ro-bind", "/dev/null", f]
    return args


def python() -> tuple[str, str]:
    """(installation prefix, interpreter) of the Python that runs the forwarder inside: the base
    installation of the running one (a virtual environment's packages are not needed)."""
    prefix = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(prefix + "/"):
        exe = f"{prefix}/bin/python3"
    return prefix, exe


def in_system_dir(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


def search_path(spec: SandboxSpec) -> str:
    return spec.env.get("PATH", DEFAULT_PATH)


def visible(spec: SandboxSpec) -> list[tuple[str, str | None]]:
    """(inside prefix, host prefix, or None for an empty tmpfs), in mount order."""
    table: list[tuple[str, str | None]] = [(d, d) for d in SYSTEM_DIRS if os.path.exists(d)]
    table += [("/tmp", None), (spec.home, None)]
    if spec.proxy is not None:
        prefix = python()[0]
        table.append((prefix, prefix))
    table += [(m.inside, str(m.host)) for m in spec.mounts]
    return table


def to_host(spec: SandboxSpec, inside: str) -> str | None:
    """The host path that ``inside`` shows, or None if it is on a tmpfs or not there at all."""
    best: tuple[int, str | None] = (-1, None)
    for prefix, host in visible(spec):
        if (inside == prefix or inside.startswith(prefix + "/")) and len(prefix) >= best[0]:
            rest = inside[len(prefix) :].lstrip("/")
            best = (len(prefix), None if host is None else posixpath.join(host, rest))
    return best[1]


def _executable(spec: SandboxSpec, inside: str) -> bool:
    host = to_host(spec, inside)
    if host is None:
        return False
    if os.path.islink(host) and not os.path.exists(host):
        return True  # it may point at a path that exists only inside: let bwrap decide
    return os.path.isfile(host) and os.access(host, os.X_OK)


def cannot_start(spec: SandboxSpec) -> str | None:
    """Why ``spec`` would fail to start (a missing mount source, socket or command), or None."""
    for m in spec.mounts:
        if not m.host.exists():
            return f"mount source {m.host} (for {m.inside}) does not exist: create it first"
    if spec.proxy is not None:
        sock = spec.proxy.socket
        if not (sock.exists() and stat.S_ISSOCK(sock.stat().st_mode)):
            return f"no Unix socket at {sock}: start the proxy listening on it first"
    name = spec.argv[0]
    if "/" in name:
        where = f"cwd {spec.cwd}"
        found = _executable(spec, posixpath.join(spec.cwd, name))
    else:
        where = f"PATH {search_path(spec)}"
        found = any(
            _executable(spec, posixpath.join(d, name)) for d in search_path(spec).split(":") if d
        )
    if found:
        return None
    shown = ", ".join(sorted({p for p, h in visible(spec) if h is not None}))
    return (
        f"command {name!r} is not an executable file inside the sandbox (searched {where}; "
        f"visible: {shown}): mount the directory that holds it, or fix argv[0]"
    )
