"""Files of this machine added to an image at their own paths (real buildah): what a pod of a
task image needs of a harness's install. The agent's Python, added to a task's built image, runs
the OpenAI SDK there as a non-root user, with none of the project's venv beside it."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

from infra.harnesses.agent import Agent, interpreter
from infra.images import ImageBuilder, ImageStore
from infra.images.layers import add_files, install_of, with_install
from infra.tasks import load_task

ROOT = Path(__file__).resolve().parents[3]


def _base(store: ImageStore, tmp_path: Path) -> str:
    """A one-layer image whose /root is 0700, as Debian's is."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (("root", 0o700), ("etc", 0o755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
    tarball = tmp_path / "base.tar"
    tarball.write_bytes(buf.getvalue())
    ref = f"localhost/openforge-test/base:{uuid.uuid4().hex[:12]}"
    store.import_rootfs(tarball, ref, {}, "/bin/true", {})
    return ref


def test_files_land_at_their_paths_traversable_and_named_by_content(tmp_path: Path) -> None:
    store = ImageStore()
    base = _base(store, tmp_path)
    install = tmp_path / "tool"
    (install / "lib").mkdir(parents=True)
    (install / "lib" / "data.txt").write_text("one\n")
    (install / "run").write_text("#!/bin/sh\n")
    (install / "run").chmod(0o700)
    os.symlink("run", install / "link")
    first = add_files(store, base, [install], "tool")
    assert first.startswith("localhost/openforge/with-tool:")
    rootfs = store.rootfs(first)
    assert (rootfs / str(install).lstrip("/") / "lib" / "data.txt").read_text() == "one\n"
    run = rootfs / str(install).lstrip("/") / "run"
    assert run.stat().st_mode & 0o555 == 0o555  # readable and runnable by any user
    assert os.readlink(run.with_name("link")) == "run"
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777  # a parent keeps its mode here
    assert add_files(store, base, [install], "tool") == first  # unchanged: a lookup
    (install / "lib" / "data.txt").write_text("two\n")
    assert add_files(store, base, [install], "tool") != first


def test_the_agents_python_runs_the_sdk_in_a_task_image_as_a_non_root_user() -> None:
    agent = Agent()
    install = install_of(agent)
    files = install.files
    assert agent.executable() in files and agent.executable().resolve() in files
    assert any(p.name == "__init__.py" and p.parent.name == "openai" for p in files)
    assert not any(part in ("torch", "vllm") for p in files for part in p.parts)  # not the venv
    builder = ImageBuilder()
    # debian:bookworm-slim: no Python, and no libssl.so.3, which `ssl` (imported by the SDK) loads
    image = builder.image(load_task(ROOT / "examples" / "images" / "package-count"))
    lib = "usr/lib/x86_64-linux-gnu/libssl.so.3"
    assert not (builder.store.rootfs(image.ref) / lib).exists()
    libraries = install.libraries
    assert Path("/", lib) in libraries and not any(p.name == "libc.so.6" for p in libraries)
    ref = with_install(builder.store, image.ref, install)
    rootfs = builder.store.rootfs(ref)
    probe = "import openai, ssl, sys; print(openai.__version__, sys.prefix)"
    done = subprocess.run(
        ["chroot", "--userspec=1000:1000", str(rootfs), str(agent.executable()), "-I", "-c", probe],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    version, prefix = done.stdout.split()
    assert version == interpreter(agent.python).openai_version
    assert Path(prefix) == agent.executable().parents[1]  # the venv, holding the SDK alone
