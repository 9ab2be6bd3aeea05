"""The saved final workspace: archived within its size bound, noted (not saved) past it, and
restored with its symlinks and nothing outside the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import final_workspace
from schemas.errors import ConfigError


def test_saved_within_the_bound_and_restored(tmp_path: Path) -> None:
    ws, rollout = tmp_path / "ws", tmp_path / "rollout"
    (ws / "src").mkdir(parents=True)
    rollout.mkdir()
    (ws / "src" / "a.py").write_text("print(1)\n")
    (ws / "link").symlink_to("src/a.py")
    saved = final_workspace.save(ws, rollout, "/app", limit_bytes=1 << 20)
    assert saved.archive == rollout / final_workspace.ARCHIVE and saved.files == 2
    note = json.loads((rollout / final_workspace.NOTE).read_text())
    assert note["saved"] is True and note["workdir"] == "/app"
    target = tmp_path / "restored"
    target.mkdir()
    final_workspace.restore(rollout, target)
    assert (target / "src" / "a.py").read_text() == "print(1)\n"
    assert (target / "link").is_symlink() and (target / "link").read_text() == "print(1)\n"


def test_a_workspace_past_the_bound_is_noted_not_saved(tmp_path: Path) -> None:
    ws, rollout = tmp_path / "ws", tmp_path / "rollout"
    ws.mkdir()
    rollout.mkdir()
    (ws / "big.bin").write_bytes(b"x" * 5000)
    saved = final_workspace.save(ws, rollout, "/app", limit_bytes=4096)
    assert saved.archive is None and not (rollout / final_workspace.ARCHIVE).exists()
    assert (
        "--max-workspace-mb" in json.loads((rollout / final_workspace.NOTE).read_text())["reason"]
    )
    with pytest.raises(ConfigError, match="more than 4096 bytes"):
        final_workspace.restore(rollout, tmp_path / "x")
