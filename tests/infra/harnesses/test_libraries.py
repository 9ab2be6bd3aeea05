"""The system libraries a harness's install loads (:mod:`infra.harnesses.libraries`), asked of
``ldd`` over real installs: the agent's Python and a Node CLI's."""

from __future__ import annotations

import shutil
from pathlib import Path

from infra.harnesses import Agent
from infra.harnesses.libraries import GLIBC, shared_libraries
from infra.images.layers import install_of
from tests.infra.harnesses.conftest import installed


def test_the_agents_python_needs_libssl_and_not_the_c_library() -> None:
    libraries = install_of(Agent()).libraries
    names = {p.name for p in libraries}
    assert {"libssl.so.3", "libcrypto.so.3", "libffi.so.8"} <= names  # ssl, ctypes
    assert not names & GLIBC and not any(n.startswith(("libX11", "libtk")) for n in names)
    for lib in libraries:  # each in a real directory, and what a name resolves to is listed too
        assert lib.parent == lib.parent.resolve() and lib.resolve() in libraries


def test_a_node_cli_needs_libstdcxx_and_directories_are_walked(tmp_path: Path) -> None:
    codex = installed("codex")
    names = {p.name for p in install_of(codex).libraries}  # its Node, and the install's own ELFs
    assert "libstdc++.so.6" in names
    (tmp_path / "deep" / "er").mkdir(parents=True)
    shutil.copy("/usr/bin/ls", tmp_path / "deep" / "er" / "program")  # loads libselinux
    (tmp_path / "notes.txt").write_text("not an ELF file\n")
    assert "libselinux.so.1" in {p.name for p in shared_libraries([tmp_path])}
    assert shared_libraries([tmp_path / "notes.txt"]) == []
