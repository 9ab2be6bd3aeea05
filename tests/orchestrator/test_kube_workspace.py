"""The final workspace carried in a Kubernetes verifier's log (:mod:`orchestrator.kube_workspace`):
the verifier's shell fragment run for real by bash over a directory, its log split and saved as
the local backend saves a workspace; property-based over what the verifier prints around it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import final_workspace, kube_workspace


def _verifier_log(workdir: Path) -> str:
    """What the verifier's container prints: the archive, then the tests' output."""
    script = kube_workspace.archive_script(str(workdir)) + "echo tests passed"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    return done.stdout


def test_the_workspace_goes_through_the_log_and_restores_as_the_agent_left_it(
    tmp_path: Path,
) -> None:
    work = tmp_path / "app"
    (work / "src").mkdir(parents=True)
    (work / "src" / "main.py").write_text("print('hi')\n")
    (work / "data.bin").write_bytes(os.urandom(100_000))
    os.symlink("src/main.py", work / "link")
    rollout = tmp_path / "rollout"
    rollout.mkdir()
    own = kube_workspace.keep(_verifier_log(work), rollout, "/app", 1 << 20)
    assert own == "tests passed\n"  # the verifier's own output, without the archive
    note = json.loads((rollout / final_workspace.NOTE).read_text())
    assert note["saved"] is True and note["files"] == 3 and note["bytes"] == 100_000 + 12 + 11
    restored = tmp_path / "restored"
    restored.mkdir()
    final_workspace.restore(rollout, restored)
    assert (restored / "src" / "main.py").read_text() == "print('hi')\n"
    assert (restored / "data.bin").read_bytes() == (work / "data.bin").read_bytes()
    assert os.readlink(restored / "link") == "src/main.py"


def test_a_workspace_over_the_limit_is_noted_not_saved(tmp_path: Path) -> None:
    work = tmp_path / "app"
    work.mkdir()
    (work / "big").write_bytes(b"\0" * 50_000)  # compresses small; its files' size counts
    own = kube_workspace.keep(_verifier_log(work), tmp_path, "/app", 10_000)
    note = json.loads((tmp_path / final_workspace.NOTE).read_text())
    assert note["saved"] is False and "more than 10000 bytes" in note["reason"]
    assert "--max-workspace-mb" in note["reason"] and own == "tests passed\n"
    assert not (tmp_path / final_workspace.ARCHIVE).exists()


def test_an_unreadable_workspace_costs_the_archive_not_the_log(tmp_path: Path) -> None:
    rollout = tmp_path / "rollout"
    rollout.mkdir()
    own = kube_workspace.keep(_verifier_log(tmp_path / "missing"), rollout, "/app", 1 << 20)
    note = json.loads((rollout / final_workspace.NOTE).read_text())
    assert note["saved"] is False and note["reason"].startswith("tar failed")
    assert own == "tests passed\n"


def test_a_log_without_the_archive_or_cut_inside_it_is_noted(tmp_path: Path) -> None:
    assert kube_workspace.keep("only tests\n", tmp_path, "/app", 1 << 20) == "only tests\n"
    assert (
        "carries no workspace"
        in json.loads((tmp_path / final_workspace.NOTE).read_text())["reason"]
    )
    cut = f"{kube_workspace.BEGIN}\nH4sIAAAA"
    assert kube_workspace.keep(cut, tmp_path, "/app", 1 << 20) == ""
    note = json.loads((tmp_path / final_workspace.NOTE).read_text())
    assert note["saved"] is False and "cut inside" in note["reason"]
    garbage = f"{kube_workspace.BEGIN}\nnot base64!\n{kube_workspace.END}\nrest\n"
    assert kube_workspace.keep(garbage, tmp_path, "/app", 1 << 20) == "rest\n"
    assert "not base64" in json.loads((tmp_path / final_workspace.NOTE).read_text())["reason"]


@settings(max_examples=60, deadline=None)
@given(
    before=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200),
    after=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=200),
    payload=st.binary(max_size=2000),
)
def test_split_takes_out_exactly_the_archive(before: str, after: str, payload: bytes) -> None:
    body = base64.encodebytes(payload).decode()
    text = f"{before}\n{kube_workspace.BEGIN}\n{body}{kube_workspace.END}\n{after}"
    part = kube_workspace.split(text)
    if kube_workspace.BEGIN in before:  # the first marker line wins; nothing else is assumed
        return
    assert part.archive == payload and part.reason is None
    assert part.log == f"{before}\n{after}"
