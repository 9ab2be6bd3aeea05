"""Set-up paths: the pins that must agree, and errors that say which set-up step to run."""

from __future__ import annotations

from pathlib import Path

import apache_beam
import pytest

from infra.paths import chromium_binary, prism_binary, versions
from schemas.errors import SetupError


def test_prism_is_pinned_to_the_installed_beam_version() -> None:
    assert versions()["PRISM_VERSION"] == apache_beam.__version__


def test_a_missing_prism_binary_says_to_run_its_setup_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENFORGE_PRISM", str(tmp_path / "nowhere" / "prism"))
    with pytest.raises(SetupError, match=r"Run `scripts/setup prism`"):
        prism_binary()


def test_the_prism_binary_set_up_built_is_found() -> None:
    path = prism_binary()  # fails with the set-up step to run where it was not built
    assert path.name == "prism" and path.stat().st_size > 1_000_000


def test_a_missing_chromium_says_to_run_its_setup_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENFORGE_CHROMIUM", raising=False)
    monkeypatch.setenv("OPENFORGE_CACHE", str(tmp_path))
    with pytest.raises(SetupError, match=r"Run `scripts/setup chromium`"):
        chromium_binary()
