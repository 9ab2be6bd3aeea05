"""The safe subset of a task's ``environment/Dockerfile`` that one machine can honour without a
container engine.

Honoured: one ``FROM`` (the base image is replaced by this machine's root filesystem, read-only;
callers say so), ``WORKDIR`` (the workspace appears at that absolute path), ``COPY`` / ``ADD`` of
files from the build context (``environment/``), ``ENV``, and ``RUN pip install ...`` /
``RUN pip3 install ...`` / ``RUN python -m pip install ...`` (installed once into a cached
environment keyed by the exact requirement list). ``LABEL``, ``EXPOSE`` and ``CMD``
change nothing a rollout sees and are noted, not applied. Anything else (``RUN`` of any other
command, ``USER``, ``ARG``, ``ENTRYPOINT`` (it starts a web task's app in the container
sandbox), a second ``FROM``, ``COPY --from``, ``ADD`` of a URL, ...) is refused with its line,
so nothing is silently skipped.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from schemas.errors import TaskError

NOTED = {"LABEL", "EXPOSE", "CMD", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK"}
PIP_FLAGS_WITHOUT_VALUE = {
    "--no-cache-dir",
    "-q",
    "--quiet",
    "-U",
    "--upgrade",
    "--no-input",
    "--disable-pip-version-check",
    "--root-user-action=ignore",
    "--break-system-packages",
    "--no-warn-script-location",
    "--user",
}
REFUSAL_ADVICE = (
    "run it with --backend kubernetes (the image is built there), or give the task a prebuilt "
    "[environment] docker_image"
)


@dataclass(frozen=True)
class Copy:
    """``COPY src... dest``: sources relative to the build context, dest absolute inside."""

    sources: tuple[str, ...]
    dest: str
    line: int


@dataclass(frozen=True)
class ImagePlan:
    """What a Dockerfile asks for, in the subset above."""

    base: str | None = None
    workdir: str | None = None
    copies: tuple[Copy, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    requirements: tuple[str, ...] = ()  # pip requirement specifiers, in order
    noted: tuple[str, ...] = ()  # instructions kept for the log, not applied


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comments dropped."""
    out: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buf:
            start = number
        if line.endswith("\\"):
            buf.append(line[:-1].strip())
            continue
        buf.append(line)
        out.append((start, " ".join(p for p in buf if p)))
        buf = []
    if buf:
        out.append((start, " ".join(buf)))
    return out


def _args(rest: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return shlex.split(rest)


def _pip_requirements(command: str) -> list[str] | None:
    """The requirements of a plain ``pip install`` command, or None if it is anything else."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] in (["pip", "install"], ["pip3", "install"]):
        rest = words[2:]
    elif words[:4] in (
        ["python", "-m", "pip", "install"],
        ["python3", "-m", "pip", "install"],
    ):
        rest = words[4:]
    else:
        return None
    reqs = []
    for word in rest:
        if word.startswith("-"):
            if word not in PIP_FLAGS_WITHOUT_VALUE:
                return None  # -r FILE, --index-url, -e, ...: not the simple form
            continue
        if any(c in word for c in ";&|`$<>()"):
            return None
        reqs.append(word)
    return reqs or None


class _Unsupported(Exception):
    """An instruction outside the subset; the message says what of it."""


@dataclass
class _Draft:
    """The plan so far, one instruction at a time."""

    base: str | None = None
    workdir: str | None = None
    copies: list[Copy] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    reqs: list[str] = field(default_factory=list)
    noted: list[str] = field(default_factory=list)

    def in_workdir(self, path: str) -> str:
        return posixpath.join(self.workdir or "/", path)


def _from(draft: _Draft, keyword: str, rest: str, number: int) -> None:
    if draft.base is not None:
        raise _Unsupported("a multi-stage build")
    draft.base = rest.split()[0] if rest else ""


def _workdir(draft: _Draft, keyword: str, rest: str, number: int) -> None:
    target = draft.in_workdir(rest) if rest else ""
    if not target.startswith("/") or "$" in target:
        raise _Unsupported("WORKDIR must be a plain path")
    draft.workdir = posixpath.normpath(target)


def _copy(draft: _Draft, keyword: str, rest: str, number: int) -> None:
    args = _args(rest)
    flags = [a for a in args if a.startswith("--")]
    if any(f.startswith("--from") or not f.startswith(("--chown", "--chmod")) for f in flags):
        raise _Unsupported(f"{keyword} with {' '.join(flags)}")
    args = [a for a in args if not a.startswith("--")]
    if len(args) < 2:
        raise _Unsupported(f"{keyword} needs a source and a destination")
    *sources, dest = args
    if keyword == "ADD" and any("://" in s or s.endswith((".tar", ".tgz", ".gz")) for s in sources):
        raise _Unsupported("ADD of a URL or an archive")
    if any(s.startswith("/") or ".." in Path(s).parts for s in sources):
        raise _Unsupported("a source outside the build context")
    absolute = dest if dest.startswith("/") else draft.in_workdir(dest)
    keep_slash = dest.endswith("/") or dest in (".", "./")
    absolute = posixpath.normpath(absolute) + ("/" if keep_slash else "")
    draft.copies.append(Copy(tuple(sources), absolute, number))


def _env(draft: _Draft, keyword: str, rest: str, number: int) -> None:
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise _Unsupported(f"cannot read it ({exc})") from exc
    if words and "=" not in words[0]:
        draft.env[words[0]] = " ".join(words[1:])  # the legacy form: ENV KEY value words
        return
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise _Unsupported("ENV KEY=VALUE expected")
        draft.env[key] = value


def _run(draft: _Draft, keyword: str, rest: str, number: int) -> None:
    command = " ".join(_args(rest)) if rest.startswith("[") else rest
    found = _pip_requirements(command)
    if found is None:
        raise _Unsupported("RUN of anything but `pip install PACKAGES`")
    draft.reqs += found


_HONOURED = {
    "FROM": _from,
    "WORKDIR": _workdir,
    "COPY": _copy,
    "ADD": _copy,
    "ENV": _env,
    "RUN": _run,
}


def parse(path: Path) -> ImagePlan:
    """The plan of the Dockerfile at ``path``; TaskError naming the line for anything else."""
    draft = _Draft()
    for number, instruction in _logical_lines(path.read_text()):
        keyword, _, rest = instruction.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        try:
            if keyword in _HONOURED:
                _HONOURED[keyword](draft, keyword, rest, number)
            elif keyword in NOTED:
                draft.noted.append(instruction)
            else:
                raise _Unsupported(f"{keyword} is outside the supported subset")
        except _Unsupported as exc:
            raise TaskError(
                f"{path}:{number}: `{instruction}`: {exc}; the local backend cannot build this "
                f"image: {REFUSAL_ADVICE}"
            ) from exc.__cause__
    return ImagePlan(
        draft.base,
        draft.workdir,
        tuple(draft.copies),
        draft.env,
        tuple(draft.reqs),
        tuple(draft.noted),
    )
