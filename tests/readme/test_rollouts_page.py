"""The manual's pages that use nothing an earlier page made (``APART_PAGES``: the rollouts page,
its harnesses and web tasks), run as a newcomer types them in a second session: a fresh copy of
its own, set up with the README's ``scripts/setup``, beside the README's session
(tests/readme/test_readme.py) and checked against the same specs (tests/readme/specs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.readme.commands import APART_PAGES, Block, blocks
from tests.readme.session import Session, newcomer_session
from tests.readme.specs import SPECS

ROOT = Path(__file__).resolve().parents[2]
APART = [b for b in blocks(ROOT) if b.not_run is None and b.source in APART_PAGES]


def test_the_pages_apart_have_blocks_to_run() -> None:
    assert {b.source for b in APART} == set(APART_PAGES)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with newcomer_session(tmp_path_factory, "rollouts-page", set_up=True) as session:
        yield session


@pytest.mark.parametrize("block", APART, ids=[f"{b.source}:{b.line}" for b in APART])
def test_rollouts_page_block(block: Block, session: Session) -> None:
    session.run_block(block, SPECS)
