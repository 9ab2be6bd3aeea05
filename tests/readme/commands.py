"""README.md and the manual under docs/ as data: their fenced ``bash`` blocks, each a list of the
commands a newcomer types, page after page in :data:`MANUAL_PAGES` order.

A command is one line as written (a trailing ``\\`` joins the next line; a trailing ``# ...``
comment and a trailing ``&`` are not part of it). A block whose comment lines include
:data:`MARKER` is not run by the tests; the text after the marker says why, visibly.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

MARKER = "# Not run by the tests:"
# The pages a newcomer reads, in order, relative to the repository root: README.md, then the
# manual. Their blocks run in this order in one shell session, so a later page's commands may use
# what an earlier page's made (tests/readme/test_readme.py checks that every docs/*.md is here).
MANUAL_PAGES = (
    "README.md",
    "docs/overview.md",
    "docs/proxy.md",
    "docs/rollouts.md",
    "docs/kubernetes.md",
    "docs/pipeline.md",
    "docs/training.md",
    "docs/production.md",
    "docs/trainer.md",
    "docs/replay-and-audit.md",
    "docs/performance.md",
    "docs/development.md",
)
_FENCE = re.compile(r"^\s*```(\w*)\s*$")
_INLINE = re.compile(r"`((?:\.venv/bin/)?openforge [^`]+)`")


@dataclass(frozen=True)
class Command:
    text: str  # as written: continuation lines joined, the trailing comment and & removed
    line: int  # its first line in its page
    background: bool  # written with a trailing & (a service the next commands use)


@dataclass(frozen=True)
class Block:
    source: str  # its page, relative to the repository root (README.md, docs/....md)
    line: int  # the opening fence's line in that page
    commands: tuple[Command, ...]
    not_run: str | None  # the marker's reason, when the block is not run by the tests


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes after a blank)."""
    quote: str | None = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _commands(lines: list[tuple[int, str]]) -> tuple[tuple[Command, ...], str | None]:
    commands: list[Command] = []
    not_run: str | None = None
    pending: list[str] = []
    first = 0
    for number, raw in lines:
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            if stripped.startswith(MARKER):
                not_run = stripped[len(MARKER) :].strip()
            continue
        text = _strip_comment(raw).strip()
        if not pending:
            first = number
        if text.endswith("\\"):
            pending.append(text[:-1].strip())
            continue
        pending.append(text)
        joined = " ".join(p for p in pending if p)
        pending = []
        background = joined.endswith("&") and not joined.endswith("&&")
        commands.append(Command(joined.removesuffix("&").strip(), first, background))
    return tuple(commands), not_run


def blocks(root: Path) -> list[Block]:
    """Every fenced ``bash`` block of the pages of :data:`MANUAL_PAGES` under ``root``, page after
    page, each page's in order."""
    return [b for page in MANUAL_PAGES for b in page_blocks(root, page)]


def page_blocks(root: Path, page: str) -> list[Block]:
    """Every fenced ``bash`` block of ``root / page``, in order."""
    found: list[Block] = []
    body: list[tuple[int, str]] | None = None
    start = 0
    for number, line in enumerate((root / page).read_text().splitlines(), start=1):
        fence = _FENCE.match(line)
        if fence and body is None:
            if fence.group(1) == "bash":
                body, start = [], number
            elif fence.group(1):
                body, start = None, 0
                # another language's block: skip to its closing fence
                found.append(Block(page, number, (), "not bash"))
            continue
        if fence and body is not None:
            commands, not_run = _commands(body)
            found.append(Block(page, start, commands, not_run))
            body = None
            continue
        if body is not None:
            body.append((number, line))
    return [b for b in found if b.not_run != "not bash"]


def inline_openforge_commands(root: Path) -> list[str]:
    """The ``openforge ...`` commands quoted inline in the prose (outside blocks) of the pages of
    :data:`MANUAL_PAGES` under ``root``, each once."""
    found: set[str] = set()
    for page in MANUAL_PAGES:
        text, inside = [], False
        for line in (root / page).read_text().splitlines():
            if line.lstrip().startswith("```"):
                inside = not inside
                continue
            if not inside:
                text.append(line)
        found |= {m.group(1).removeprefix(".venv/bin/") for m in _INLINE.finditer("\n".join(text))}
    return sorted(found)


def subcommand_and_options(command: str) -> tuple[list[str], list[str]]:
    """``openforge A B --x 1 --y`` -> (``[A, B]``, ``[--x, --y]``): the sub-command path (the
    words before the first option or argument that is not a sub-command) and every option named.
    ``command`` starts at ``openforge`` (any prefix such as ``.venv/bin/`` removed)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    names = [w.rsplit("/", 1)[-1] for w in words]
    words = words[names.index("openforge") + 1 :] if "openforge" in names else words
    path: list[str] = []
    for word in words:
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        path.append(word)
    options = sorted({w.split("=", 1)[0] for w in words if re.match(r"--[a-z]", w)})
    return path, options
