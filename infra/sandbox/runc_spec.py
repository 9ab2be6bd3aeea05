"""The OCI runtime spec (``config.json``) of one container-sandbox run, built from a
:class:`~infra.sandbox.base.SandboxSpec`; pure, so it is tested without starting anything.

What the container gets: the image's root filesystem (with a writable layer of its own, mounted
by the caller at ``rootfs``), new pid, mount, ipc, uts, cgroup and network namespaces (the
network holds only loopback; with a proxy, the forwarder hook listens there), a fresh ``/proc``,
a minimal ``/dev``, ``/sys`` read-only, private tmpfs ``/tmp`` and home, the spec's mounts, the
image's user, Docker's default capability set for a root user and none for any other, no new
privileges, the memory, pids and CPU limits of the spec in a cgroup of its own, and no rlimit
(each is inherited, within the machine's hard limits: asking for more fails here). Where no
cgroup can be made (a non-root user: :mod:`infra.rootless`), rlimits stand in for the memory and
process limits, and CPU is not capped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from infra.local.process import SERVICE_ID_ENV
from infra.sandbox.base import SandboxSpec

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORWARDER = Path(__file__).with_name("forwarder.py")
# Docker's default set, for a process that runs as root inside.
ROOT_CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
CFS_PERIOD_US = 100_000


def _system_mounts() -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
    ]


def _tmpfs(inside: str, uid: int, gid: int, mode: str) -> dict[str, Any]:
    return {
        "destination": inside,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", f"mode={mode}", f"uid={uid}", f"gid={gid}"],
    }


def mounts(spec: SandboxSpec) -> list[dict[str, Any]]:
    """Every mount, in order: the system ones, /tmp, the home, then the spec's."""
    assert spec.root is not None
    out = _system_mounts()
    out.append(_tmpfs("/tmp", 0, 0, "1777"))
    if all(m.inside != spec.home for m in spec.mounts):
        out.append(_tmpfs(spec.home, spec.root.uid, spec.root.gid, "700"))
    for m in spec.mounts:
        options = ["rbind", "nosuid", "nodev", "ro" if m.read_only else "rw"]
        out.append(
            {"destination": m.inside, "type": "bind", "source": str(m.host), "options": options}
        )
    return out


def environment(spec: SandboxSpec, sandbox_id: str) -> list[str]:
    env = {"PATH": DEFAULT_PATH, "HOME": spec.home, "TMPDIR": "/tmp", **spec.env}
    env[SERVICE_ID_ENV] = sandbox_id
    return [f"{k}={v}" for k, v in env.items()]


def resources(spec: SandboxSpec, memsw: bool) -> dict[str, Any]:
    limit = spec.limits.memory_mib * 2**20
    memory: dict[str, Any] = {"limit": limit}
    if memsw:  # no swapping past the limit either
        memory["swap"] = limit
    out: dict[str, Any] = {
        "memory": memory,
        "pids": {"limit": spec.limits.max_processes},
        "devices": [{"allow": False, "access": "rwm"}],
    }
    if spec.limits.cpus is not None:
        out["cpu"] = {"quota": int(spec.limits.cpus * CFS_PERIOD_US), "period": CFS_PERIOD_US}
    if spec.limits.cpu_shares is not None:
        out.setdefault("cpu", {})["shares"] = spec.limits.cpu_shares
    return out


def forwarder_hook(spec: SandboxSpec, sandbox_id: str, pidfile: Path) -> dict[str, Any]:
    """The createRuntime hook that starts the proxy forwarder in the container's network."""
    assert spec.proxy is not None
    python = sys.executable
    argv = [python, "-I", "-S", str(FORWARDER), "--hook", str(spec.proxy.port)]
    argv += [str(spec.proxy.socket), str(pidfile)]
    return {"path": python, "args": argv, "env": [f"{SERVICE_ID_ENV}={sandbox_id}"], "timeout": 30}


def rlimits(spec: SandboxSpec) -> list[dict[str, Any]]:
    """Per-process limits where no cgroup can hold the container (a non-root user's): address
    space for memory (weaker: it bounds what a process maps, not what the container uses, and
    engines that reserve address space may fail under it) and, for a non-root user inside,
    processes (for uid 0 inside, which is the host user, it would count the user's own)."""
    memory = spec.limits.memory_mib * 2**20
    out = [{"type": "RLIMIT_AS", "soft": memory, "hard": memory}]
    assert spec.root is not None
    if spec.root.uid != 0:
        tasks = spec.limits.max_processes
        out.append({"type": "RLIMIT_NPROC", "soft": tasks, "hard": tasks})
    return out


def runtime_spec(
    spec: SandboxSpec,
    sandbox_id: str,
    rootfs: Path,
    cgroup: str | None,
    pidfile: Path,
    memsw: bool,
) -> dict[str, Any]:
    """The whole ``config.json`` for ``spec`` over the mounted ``rootfs``; limits in ``cgroup``
    (a path under each controller's hierarchy), or as :func:`rlimits` where it is None."""
    assert spec.root is not None
    caps = ROOT_CAPABILITIES if spec.root.uid == 0 else []
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": spec.root.uid, "gid": spec.root.gid},
            "args": list(spec.argv),
            "env": environment(spec, sandbox_id),
            "cwd": spec.cwd,
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "openforge-sandbox",
        "mounts": mounts(spec),
        "linux": {
            "namespaces": [
                {"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")
            ],
            "maskedPaths": MASKED,
            "readonlyPaths": READ_ONLY,
        },
    }
    if cgroup is not None:
        config["linux"]["cgroupsPath"] = cgroup
        config["linux"]["resources"] = resources(spec, memsw)
    else:
        config["process"]["rlimits"] = rlimits(spec)
    if spec.proxy is not None:
        config["hooks"] = {"createRuntime": [forwarder_hook(spec, sandbox_id, pidfile)]}
    return config
