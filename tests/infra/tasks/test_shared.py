"""A task set's shared files (``[shared]`` in its manifest): one source, copied into each task
as the set is loaded; bad tables are TaskErrors that name the manifest and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.tasks import load_dataset
from infra.tasks.shared import place, shared_files
from schemas.errors import TaskError


def _task(root: Path, name: str) -> None:
    (root / name / "tests").mkdir(parents=True)
    (root / name / "task.toml").write_text('version = "1.0"\n')
    (root / name / "instruction.md").write_text("Do it.\n")
    (root / name / "tests" / "test.sh").write_text("#!/bin/sh\nexit 0\n")


def _manifest(root: Path, shared: str) -> Path:
    tasks = '[[tasks]]\npath = "a"\n\n[[tasks]]\npath = "b"\nsplit = "heldout"\n\n'
    # A top-level key goes before the tables (after them TOML reads it as the last task's).
    text = tasks + shared if shared.startswith("[") else shared + "\n" + tasks
    (root / "manifest.toml").write_text(text)
    return root / "manifest.toml"


def test_loading_the_set_copies_the_one_source_into_every_task(tmp_path: Path) -> None:
    for name in ("a", "b"):
        _task(tmp_path, name)
    source = tmp_path / "kit" / "driver.py"
    source.parent.mkdir()
    source.write_text("VERSION = 1\n")
    source.chmod(0o755)
    _manifest(tmp_path, '[shared]\n"solution/driver.py" = "kit/driver.py"\n')
    assert [t.id for t in load_dataset(tmp_path)] == ["a", "b"]
    copies = [tmp_path / n / "solution" / "driver.py" for n in ("a", "b")]
    assert all(c.read_text() == "VERSION = 1\n" and c.stat().st_mode & 0o111 for c in copies)
    source.write_text("VERSION = 2\n")  # a fix to the source reaches every task at its next load
    load_dataset(tmp_path / "manifest.toml")
    assert all(c.read_text() == "VERSION = 2\n" for c in copies)


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('shared = "x"', "shared must be a table"),
        ('[shared]\n"../out.py" = "kit/driver.py"', "a path inside each task"),
        ('[shared]\n"/etc/out.py" = "kit/driver.py"', "a path inside each task"),
        ('[shared]\n"solution/x.py" = 3', "the source file's path"),
        ('[shared]\n"solution/x.py" = "kit/missing.py"', "is not a file"),
    ],
)
def test_a_bad_shared_table_names_the_manifest_and_the_fix(
    tmp_path: Path, table: str, said: str
) -> None:
    for name in ("a", "b"):
        _task(tmp_path, name)
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "driver.py").write_text("")
    manifest = _manifest(tmp_path, table + "\n")
    with pytest.raises(TaskError, match=said) as err:
        load_dataset(manifest)
    assert str(manifest) in str(err.value)
    assert not (tmp_path / "a" / "solution").exists()  # nothing is copied from a bad table


@given(st.binary(max_size=256), st.binary(max_size=256))
def test_place_writes_only_what_differs(old: bytes, new: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source, task = root / "src.bin", root / "task"
        source.write_bytes(new)
        (task / "sub").mkdir(parents=True)
        (task / "sub" / "f.bin").write_bytes(old)
        shared = shared_files({"sub/f.bin": "src.bin"}, root / "manifest.toml")
        assert place(shared, [task]) == (0 if old == new else 1)
        assert (task / "sub" / "f.bin").read_bytes() == new
        assert place(shared, [task]) == 0
