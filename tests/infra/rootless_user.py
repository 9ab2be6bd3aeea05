"""A real non-root user for the rootless tests: made with ``useradd`` (which writes its
``/etc/subuid`` and ``/etc/subgid`` ranges, as on any Debian machine), and commands run as that
user with nothing of root's but read access to what the command needs.

This machine keeps the project's Python and its environment under ``/root`` (mode 700), which
no other user may enter. Rather than change ``/root`` on the host, each command runs in a mount
namespace of its own where every directory on the way to what it needs that others may not
enter is replaced by a tmpfs holding only those entries (bind mounts of the originals): the
user reads the interpreter, the environment and the checkout, and nothing else of root's.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NAME = "openforge-rootless"
HIDDEN = "/run/openforge-rootless-originals"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path


def ensure_user(name: str = NAME) -> User:
    """The user, made once (``useradd -m``: a home and subordinate id ranges)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def _needed(paths: Sequence[Path]) -> dict[Path, set[str]]:
    """Each ancestor that others may not enter, with its entries on the way to ``paths``."""
    blocked: dict[Path, set[str]] = {}
    for path in paths:
        real = Path(os.path.realpath(path))
        for child in (real, *real.parents):
            parent = child.parent
            if child == parent:
                continue
            if not os.stat(parent).st_mode & 0o001:
                blocked.setdefault(parent, set()).add(child.name)
    return blocked


def _access_script(paths: Sequence[Path]) -> str:
    lines = ["set -e", f"mkdir -p {HIDDEN}"]
    for i, (parent, names) in enumerate(sorted(_needed(paths).items())):
        keep = f"{HIDDEN}/{i}"
        lines += [f"mkdir -p {keep}", f"mount --bind {shlex.quote(str(parent))} {keep}"]
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(parent))}")
        for name in sorted(names):
            inside, original = shlex.quote(str(parent / name)), shlex.quote(f"{keep}/{name}")
            make = "mkdir" if (parent / name).is_dir() else "touch"
            lines += [f"{make} {inside}", f"mount --bind {original} {inside}"]
    return "\n".join(lines)


def run_as(
    user: User,
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    reads: Sequence[Path],
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``user`` (its own uid, gid and groups; no capability), in ``cwd``, with
    exactly ``env`` (plus HOME, USER, PATH), able to read ``reads`` (and their ancestors)."""
    script = _access_script([*reads, cwd, Path(sys.executable)])
    full_env = {
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        **env,
    }
    setpriv = shutil.which("setpriv") or "setpriv"
    become = [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
    command = [*become, "env", "-i", *(f"{k}={v}" for k, v in full_env.items()), *argv]
    script += f"\ncd {shlex.quote(str(cwd))}\nexec {shlex.join(command)}\n"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def chown_tree(path: Path, user: User) -> None:
    """Give ``path`` (made by root for the user's use) to the user."""
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(path)], check=True)
