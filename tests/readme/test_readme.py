"""Every command README.md and the manual under docs/ show, run as a newcomer types it.

The fenced ``bash`` blocks of README.md and then of each docs/ page (``MANUAL_PAGES``, in that
order) are read as data (``tests/readme/commands.py``) and every command runs, in that order, in
one copy of the repository (what a fresh clone holds: no ``.venv``, no ``runs/``), from the
copy's root, with the relative paths as written: the README's first block's ``scripts/setup``
makes the copy's ``.venv``. A command must exit 0 and print what the page says it does
(``tests/readme/specs.py``); services (``services up``, ``proxy``) are started, used by the
block's next commands and stopped with Ctrl-C at the block's end (one started with a trailing
``&`` runs on in the background, as in a shell, until the session ends), and must exit 0.
Placeholders (``PORT``, ``MODEL_DIR``) are filled from what an earlier command printed. The main
job runs with the README's own command plus the short run's ``--set`` options (``SHORT``), as
the manual says. A block the tests cannot run says so on its page (``# Not run by the tests:
why``); its commands, and every ``openforge ...`` command the prose of any page quotes, are
checked against their ``--help``: each sub-command exists and takes every option named. Every
docs/ page is one of ``MANUAL_PAGES``, and README.md stays a front page (at most 250 lines).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme.commands import (
    MANUAL_PAGES,
    Block,
    Command,
    blocks,
    inline_openforge_commands,
    subcommand_and_options,
)
from tests.readme.session import Session, newcomer_session
from tests.readme.specs import SPECS, TEST_COMMAND

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 250  # a front page; the manual is under docs/

BLOCKS = blocks(ROOT)
RUN = [b for b in BLOCKS if b.not_run is None]


def _commands(only: list[Block]) -> list[Command]:
    return [c for b in only for c in b.commands]


def test_every_command_the_readme_runs_has_a_spec_and_no_spec_is_stale() -> None:
    written = {c.text for c in _commands(RUN)} - {TEST_COMMAND}
    assert written - SPECS.keys() == set(), "manual commands without a spec in SPECS"
    assert SPECS.keys() - written == set(), "specs of commands the manual no longer has"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    assert TEST_COMMAND in {c.text for c in _commands(RUN)}
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert TEST_COMMAND in lines


def _help(path: list[str]) -> str:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "openforge"), *path, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, f"openforge {' '.join(path)} --help: {done.stderr[-2000:]}"
    return done.stdout


NOT_RUN = [c.text for c in _commands([b for b in BLOCKS if b.not_run]) if "openforge" in c.text]


def test_every_docs_page_is_a_manual_page() -> None:
    """A new page under docs/ is read (its blocks run) only if it is in MANUAL_PAGES."""
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages - set(MANUAL_PAGES) == set(), "docs pages missing from MANUAL_PAGES"
    assert all((ROOT / p).is_file() for p in MANUAL_PAGES)
    assert len(set(MANUAL_PAGES)) == len(MANUAL_PAGES) and MANUAL_PAGES[0] == "README.md"


def test_the_readme_is_a_front_page() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into docs/"


@pytest.mark.parametrize("command", NOT_RUN + inline_openforge_commands(ROOT))
def test_a_command_the_tests_cannot_run_exists_with_its_options(command: str) -> None:
    path, options = subcommand_and_options(command)
    text = _help(path)
    missing = [o for o in options if o not in text]
    assert not missing, f"`openforge {' '.join(path)}` does not take {missing}"


def test_the_gpu_smoke_test_takes_its_options() -> None:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "trainer.gpu_smoke", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--param-dtype" in done.stdout and "--out" in done.stdout


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One newcomer's session over a fresh copy: the README's first command sets it up."""
    with newcomer_session(tmp_path_factory, "readme") as session:
        yield session


@pytest.mark.parametrize("block", RUN, ids=[f"{b.source}:{b.line}" for b in RUN])
def test_readme_block(block: Block, session: Session) -> None:
    session.run_block(block, SPECS, skip=TEST_COMMAND)  # the test command: this very suite
