"""The images of calls (screenshots a harness sent the model), stored once by content hash.

Not container images (that is :mod:`infra.images`): the pixels of an image content part. The
proxy stores each image's bytes once, under the SHA-256 of the bytes, beside the event log; a
recorded request body and a completion event refer to it by that hash (:data:`REF_PREFIX`), so
a screenshot resent with every later call of a conversation is stored once. Readers (the audit,
replay, a trainer that needs the pixels) look an image up by its hash.

Layout: ``DIR/ab/abcdef....png`` (the first two hex digits as a directory; the suffix from the
media type). A write goes to a temporary file and is renamed into place, so a reader never sees
half an image and two writers of the same image do not conflict.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from schemas.errors import OpenForgeError

REF_PREFIX = "openforge-image:sha256:"  # what replaces an image's bytes in a recorded body
SUFFIXES = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
}
MEDIA_TYPES = {suffix: media for media, suffix in SUFFIXES.items()}


class ImageNotFound(OpenForgeError):
    """An image a record refers to is not in the store (recorded with ``--no-bodies``, stored
    elsewhere, or deleted): point the reader at the proxy's ``--image-dir``."""


def digest(data: bytes) -> str:
    """The image's id: the SHA-256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def ref(sha: str) -> str:
    """The reference that stands for the image in a recorded body."""
    return REF_PREFIX + sha


def sha_of(value: str) -> str | None:
    """The hash a reference names (None: ``value`` is not a reference)."""
    return value[len(REF_PREFIX) :] if value.startswith(REF_PREFIX) else None


class ImageStore:
    """A directory of images named by their content hash."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stored = 0  # images this store object wrote (new ones), and their bytes
        self.stored_bytes = 0

    def _path(self, sha: str, media_type: str) -> Path:
        return self.root / sha[:2] / f"{sha}{SUFFIXES[media_type]}"

    def put(self, data: bytes, media_type: str) -> tuple[str, bool]:
        """Store ``data`` (once); its hash, and whether it was new. ``media_type`` must be one
        of :data:`SUFFIXES`."""
        sha = digest(data)
        path = self._path(sha, media_type)
        if path.exists():
            return sha, False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.stored += 1
        self.stored_bytes += len(data)
        return sha, True

    def find(self, sha: str) -> Path | None:
        """The file of image ``sha`` (None: not stored)."""
        if len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
            return None
        for suffix in SUFFIXES.values():
            path = self.root / sha[:2] / f"{sha}{suffix}"
            if path.exists():
                return path
        return None

    def get(self, sha: str) -> tuple[bytes, str]:
        """The image's bytes and media type; ImageNotFound if it is not stored."""
        path = self.find(sha)
        if path is None:
            raise ImageNotFound(
                f"image {sha} is not in {self.root}: it was recorded with --no-bodies or by a "
                "proxy with another --image-dir; point the reader at that directory"
            )
        return path.read_bytes(), MEDIA_TYPES[path.suffix]

    def usage(self) -> tuple[int, int]:
        """Images stored and their bytes."""
        files = [p for p in self.root.glob("??/*") if not p.name.startswith(".tmp-")]
        return len(files), sum(p.stat().st_size for p in files)

    def resolve(self, body: Any, key: str = "") -> Any:
        """A recorded body with each reference replaced by its image again: a base64 data
        URL, or the bare base64 under Messages' ``data`` key (what the caller had sent)."""
        if isinstance(body, list):
            return [self.resolve(item) for item in body]
        if isinstance(body, dict):
            return {k: self.resolve(v, k) for k, v in body.items()}
        sha = sha_of(body) if isinstance(body, str) else None
        if sha is None:
            return body
        data, media_type = self.get(sha)
        payload = base64.b64encode(data).decode()
        return payload if key == "data" else f"data:{media_type};base64,{payload}"
