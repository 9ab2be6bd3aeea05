"""A Kubernetes rollout's final workspace, carried out of its pod in the verifier's log.

The workspace lives in the pod's ``emptyDir`` and dies with the pod; the API gives a finished
pod no file access, but it keeps each container's log until the pod is deleted. So the
``verifier`` container, before it runs the tests (none of their writes are in it), writes the
workspace as the agent left it to its standard output: a gzipped tar, base64, between two
marker lines. The backend reads the verifier's log before deleting the pod (it reads it anyway,
for ``verifier.out``), and :func:`keep` splits the archive from the verifier's own output and
saves it in the rollout's directory as the local backend does (:mod:`orchestrator.final_workspace`:
``final-workspace.tar.gz`` and ``final-workspace.json``), so ``openforge replay rescore`` scores
rollouts of both backends alike.

Limits: the compressed archive is kept in the log only up to :data:`ARCHIVE_LIMIT` (a node's
container log is rotated at 10 MiB by default; base64 adds a third); past it, or past the
backend's limit on the files' total size, the note says it was not saved and why. The archive
needs ``tar``, ``gzip`` and ``base64`` in the task's image (the verifier already needs ``tar``
for the tests); an image without them gets a note saying so, and the rollout is scored as usual.
"""

from __future__ import annotations

import base64
import binascii
import io
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.final_workspace import ARCHIVE, too_large, write_note

BEGIN = "==openforge:final-workspace:begin=="
END = "==openforge:final-workspace:end=="
ARCHIVE_LIMIT = 6 << 20  # bytes of compressed archive written to the verifier's log
# What the log read must take to hold the whole archive (base64 lines of 76 + newline).
LOG_BYTES = ARCHIVE_LIMIT * 4 // 3 + ARCHIVE_LIMIT // 57 + 4096


def archive_script(workdir: str) -> str:
    """Shell (for the verifier's container, before the tests): the workspace between the
    markers on stdout, or one line saying why not. Works in a fresh private directory, so that
    nothing the agent left in the shared ``/tmp`` can redirect the write."""
    wd = shlex.quote(workdir)
    return (
        f"echo {BEGIN}; "
        "d=$(mktemp -d) && { "
        f'if ! tar -czf "$d/w.tgz" -C {wd} . 2>"$d/err"; then '
        'echo "error: tar failed: $(head -c 300 "$d/err" | tr "\\n" " ")"; '
        f'elif [ "$(wc -c < "$d/w.tgz")" -gt {ARCHIVE_LIMIT} ]; then '
        'echo "error: the compressed workspace is $(wc -c < "$d/w.tgz") bytes, over the '
        f'{ARCHIVE_LIMIT} a container log carries"; '
        f'elif ! base64 "$d/w.tgz"; then echo "error: no base64 in the image"; fi; '
        'rm -rf "$d"; } || echo "error: no temporary directory"; '
        f"echo {END}; "
    )


@dataclass(frozen=True)
class Split:
    """A verifier log, taken apart: the archive (None: not carried), why not, and the
    verifier's own output."""

    archive: bytes | None
    reason: str | None
    log: str


def split(text: str) -> Split:
    """The archive between the markers, and the rest of the log."""
    head, begin, rest = text.partition(BEGIN + "\n")
    if not begin:
        return Split(None, "the verifier's log carries no workspace", text)
    body, end, tail = rest.partition(END + "\n")
    if not end:
        return Split(None, "the verifier's log was cut inside the workspace archive", head)
    lines = body.strip()
    if lines.startswith("error: "):
        return Split(None, lines.removeprefix("error: "), head + tail)
    try:
        return Split(base64.b64decode(lines.replace("\n", ""), validate=True), None, head + tail)
    except (binascii.Error, ValueError) as exc:
        return Split(None, f"the workspace archive in the log is not base64: {exc}", head + tail)


def _measure(archive: bytes, limit: int) -> tuple[int, int]:
    """(bytes, files) in the archive, as the local backend counts them (regular files' sizes;
    symlinks count as files); stops counting once past ``limit``."""
    total = files = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar:
            if member.isfile() or member.issym():
                # A symlink's own size (lstat's, as the local backend counts) is its target's.
                total += member.size if member.isfile() else len(member.linkname.encode())
                files += 1
                if total > limit:
                    break
    return total, files


def keep(verifier_log: str, rollout_dir: Path, workdir: str, limit_bytes: int) -> str:
    """Save the workspace the log carries into ``rollout_dir`` (with its note, either way);
    returns the verifier's own output."""
    part = split(verifier_log)
    reason = part.reason
    if part.archive is not None:
        try:
            size, files = _measure(part.archive, limit_bytes)
        except (tarfile.TarError, OSError, EOFError) as exc:
            reason = f"the workspace archive in the log cannot be read: {exc}"
        else:
            if size <= limit_bytes:
                (rollout_dir / ARCHIVE).write_bytes(part.archive)
                write_note(rollout_dir, workdir, limit_bytes, saved=True, bytes=size,
                           files=files, archive_bytes=len(part.archive))  # fmt: skip
                return part.log
            reason = too_large(limit_bytes, size, files)
    write_note(rollout_dir, workdir, limit_bytes, saved=False, reason=reason)
    return part.log
