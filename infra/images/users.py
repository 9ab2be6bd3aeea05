"""An image's ``USER`` as numeric ids, read from the image's own ``/etc/passwd`` and
``/etc/group`` (as a container engine does), so a ``USER`` that does not exist is refused before
any rollout starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from schemas.errors import TaskError


@dataclass(frozen=True)
class ImageUser:
    """Who the image's processes run as."""

    name: str
    uid: int
    gid: int
    home: str = "/"

    @property
    def root(self) -> bool:
        return self.uid == 0


def _table(path: Path) -> list[list[str]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def image_user(rootfs: Path, user: str | None, where: str) -> ImageUser:
    """``user`` (``name``, ``uid``, ``name:group`` or ``uid:gid``; None is root) in ``rootfs``."""
    if not user:
        return ImageUser("root", 0, 0, "/root")
    name, _, group = user.partition(":")
    passwd = _table(rootfs / "etc" / "passwd")
    entry = next(
        (e for e in passwd if len(e) >= 6 and (e[0] == name or (name.isdigit() and e[2] == name))),
        None,
    )
    if entry is None and not name.isdigit():
        raise TaskError(
            f"{where}: USER {user!r} does not exist in the image (no {name!r} in its "
            "/etc/passwd): create it in the Dockerfile (RUN useradd ...) before USER"
        )
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry else uid
    if group:
        groups = _table(rootfs / "etc" / "group")
        found = next((g for g in groups if len(g) >= 3 and group in (g[0], g[2])), None)
        if found is None and not group.isdigit():
            raise TaskError(f"{where}: USER {user!r}: no group {group!r} in the image")
        gid = int(found[2]) if found else int(group)
    return ImageUser(entry[0] if entry else name, uid, gid, entry[5] if entry else "/")
