"""Running containers as a non-root user: a user namespace holding the user's subordinate ids.

Building images (buildah) and running containers (runc) need root's powers over file owners,
mounts and namespaces. A non-root user gets them inside a user namespace of their own, as
rootless podman does: uid and gid 0 there are the user, and 1..N are the user's subordinate
ranges (``/etc/subuid`` and ``/etc/subgid``, which ``useradd`` writes; Debian's ``uidmap`` package
provides the set-uid ``newuidmap``/``newgidmap`` that install them), so an image's own users
(``USER worker``, files owned by ``_apt``) exist as themselves. The process also gets a mount
namespace of its own (its overlay mounts are its own) and keeps the host's network and pids.

:func:`argv` is the command line that re-runs a command there (util-linux ``unshare``, which
execs the command in place: signals and exit codes are the command's own). Inside, buildah is
told it already runs in its user namespace (the ``_CONTAINERS_*`` variables that ``buildah
unshare`` sets), and :func:`inside` is true: the container sandbox then runs without cgroups (a
non-root user cannot create them on this machine's cgroup v1 hierarchy) and with rlimits instead
(:mod:`infra.sandbox.runc`).

What a user sees of it: files an image's non-root user wrote in a run directory belong to a
subordinate id on the host; remove such a directory with ``buildah unshare rm -rf DIR``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = "OPENFORGE_ROOTLESS_UID"  # set inside: the host uid the namespace's root stands for
OPT_OUT = "OPENFORGE_ROOTLESS"  # "0": never enter a user namespace (bubblewrap as non-root)


@dataclass(frozen=True)
class IdRange:
    """A subordinate id range: host ids ``start .. start + count - 1``."""

    start: int
    count: int


def _range(path: Path, user: str, uid: int) -> IdRange | None:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        ok = len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit()
        if ok and parts[0] in (user, str(uid)) and int(parts[2]) > 0:
            return IdRange(int(parts[1]), int(parts[2]))
    return None


def _user() -> tuple[str, int, int]:
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return name, uid, gid


def inside() -> bool:
    """True in the user namespace this module makes (a non-root user's containers)."""
    return MARKER in os.environ and os.geteuid() == 0


def host_uid() -> int:
    """The uid this process stands for on the host (the user's, inside the namespace)."""
    return int(os.environ[MARKER]) if inside() else os.geteuid()


def wanted() -> bool:
    """Whether this process should enter the namespace: a non-root user, not inside already,
    not opted out with ``OPENFORGE_ROOTLESS=0``."""
    return os.geteuid() != 0 and not inside() and os.environ.get(OPT_OUT, "1") != "0"


def unavailable() -> str | None:
    """Why this user cannot have the namespace here (None when they can)."""
    name, uid, _ = _user()
    missing = [t for t in ("unshare", "newuidmap", "newgidmap") if shutil.which(t) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: install Debian's uidmap and util-linux "
            "(`sudo apt-get install uidmap`)"
        )
    try:
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
            return "user namespaces are disabled here (sysctl user.max_user_namespaces = 0)"
    except (OSError, ValueError):
        pass
    for table in ("/etc/subuid", "/etc/subgid"):
        if _range(Path(table), name, uid) is None:
            return (
                f"no subordinate ids for {name} in {table}: add a range "
                f"(`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {name}`)"
            )
    return None


def argv(command: list[str]) -> list[str]:
    """``command`` run in the user's namespace (call only when :func:`unavailable` is None)."""
    name, uid, _ = _user()
    uids = _range(Path("/etc/subuid"), name, uid)
    gids = _range(Path("/etc/subgid"), name, uid)
    assert uids is not None and gids is not None, "check unavailable() first"
    unshare = shutil.which("unshare") or "unshare"
    return [
        unshare,
        "--user",
        "--map-root-user",
        # util-linux 2.38 (Debian 12): OUTER,INNER,COUNT; newuidmap installs both mappings.
        f"--map-users={uids.start},1,{uids.count}",
        f"--map-groups={gids.start},1,{gids.count}",
        "--mount",
        "--propagation",
        "private",
        "--",
        *command,
    ]


def environment() -> dict[str, str]:
    """The variables a command inside gets on top of this process's: our marker, and what
    buildah reads to know it already runs in its user namespace."""
    _, uid, gid = _user()
    return {
        MARKER: str(uid),
        "_CONTAINERS_USERNS_CONFIGURED": "done",
        "_CONTAINERS_ROOTLESS_UID": str(uid),
        "_CONTAINERS_ROOTLESS_GID": str(gid),
    }


def reexec() -> None:
    """Replace this process with itself in the user's namespace (never returns)."""
    again = argv([sys.executable, *sys.orig_argv[1:]])
    os.execve(again[0], again, {**os.environ, **environment()})
