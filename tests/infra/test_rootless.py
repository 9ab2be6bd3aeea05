"""Containers for a non-root user: a real user made for the test (``useradd``, its subordinate
ids), real buildah and runc in the user namespace of :mod:`infra.rootless`, from the CLI as the
user types it. Root is needed only to make the user; nothing the user runs has root's powers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import rootless
from infra.images import ImageStore
from tests.infra.rootless_user import User, chown_tree, ensure_user, run_as

ROOT = Path(__file__).resolve().parents[2]
BASES = ("localhost/debian:bookworm-slim", "localhost/python:3.11-slim")


def _python(user: User, code: str, *args: str) -> dict[str, object]:
    done = run_as(
        user,
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code, *args],
        ROOT,
        {},
        [ROOT / ".venv"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_IDS = (
    "import json, sys; from infra import rootless; from infra.images import ImageStore\n"
    "assert rootless.inside(), 'not in the user namespace'\n"
    "s = ImageStore()\n"
    "for a in sys.argv[1:]: s.run('pull', '-q', a)\n"
    f"ids = {{r: s.image_id(r) if s.exists(r) else None for r in {BASES!r}}}\n"
    "print(json.dumps({'root': str(s.root), 'ids': ids}))"
)


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    """The user, with the base images in a store of its own: copied from root's store where
    they differ (`scripts/setup images` run as that user makes them with mmdebstrap's unshare
    mode: 199 s for the three here, too long for every run). The user's store, like root's, is
    a cache kept between runs."""
    assert os.geteuid() == 0, "the rootless tests make a user: run them as root, as CI does"
    user = ensure_user()
    root_store = ImageStore()
    have = _python(user, _enter(_IDS))
    assert str(have["root"]).startswith(str(user.home))
    stale = [r for r in BASES if have["ids"][r] != root_store.image_id(r)]  # type: ignore[index]
    if stale:
        shared = user.home / "bases"
        shared.mkdir(exist_ok=True)
        archives = []
        for ref in stale:
            archive = shared / (ref.split("/")[-1].replace(":", "_") + ".tar")
            archive.unlink(missing_ok=True)
            root_store.run("push", "-q", ref, f"oci-archive:{archive}:{ref}")
            archives.append(f"oci-archive:{archive}")
        chown_tree(shared, user)
        try:
            have = _python(user, _enter(_IDS), *archives)
        finally:
            shutil.rmtree(shared)
    assert have["ids"] == {r: root_store.image_id(r) for r in BASES}
    yield user


def _enter(code: str) -> str:
    """Python that re-runs itself in the user namespace first, as the CLI does."""
    return "from infra import rootless\nif rootless.wanted(): rootless.reexec()\n" + code


SCENARIO = """
import json, os, socket, sys, threading, uuid
from pathlib import Path
from infra.images import ImageStore
from infra.sandbox import Limits, Mount, ProxyEndpoint, RootFs, RuncSandbox, SandboxSpec
tmp = Path(sys.argv[1]); ws = tmp / "ws"; ws.mkdir()
os.chown(ws, 1000, 1000)
root = ImageStore().rootfs("localhost/python:3.11-slim")
sandbox = RuncSandbox(state=tmp / "state"); sandbox.preflight()
mark = uuid.uuid4().hex
sock = tmp / "proxy.sock"; server = socket.socket(socket.AF_UNIX); server.bind(str(sock))
server.listen()
def serve():
    while True:
        try: conn, _ = server.accept()
        except OSError: return
        conn.recv(4096); conn.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\nproxied"); conn.close()
threading.Thread(target=serve, daemon=True).start()
def run(script, uid=1000, **kw):
    spec = SandboxSpec(argv=("sh", "-c", script), stdout=tmp / "out", stderr=tmp / "err",
        cwd="/app", env={"MARK": mark}, mounts=(Mount(ws, "/app", read_only=False),),
        root=RootFs(root, uid, uid), **kw)
    r = sandbox.run(spec)
    return {"outcome": r.outcome.value, "code": r.exit_code, "ooms": r.oom_kills,
            "out": (tmp / "out").read_text(), "err": (tmp / "err").read_text()[-500:]}
res = {"rootless": sandbox.rootless}
res["user"] = run("id -u; python --version; echo w > /app/w.txt; echo x > /etc/x; echo ok")
res["owner"] = os.stat(ws / "w.txt").st_uid
res["layer"] = run("cat /etc/x 2>/dev/null || echo absent", uid=0)
client = ("import urllib.request, socket\\n"
          "try:\\n socket.create_connection(('10.0.0.1', 80), timeout=2); print('CONNECTED')\\n"
          "except OSError: print('blocked')\\n"
          "print(urllib.request.urlopen('http://127.0.0.1:18080/x', timeout=10).read().decode())")
(ws / "c.py").write_text(client)
res["proxy"] = run("python3 /app/c.py", proxy=ProxyEndpoint(sock, 18080))
res["memory"] = run("python3 -c 'b = bytearray(512 * 2**20)'", limits=Limits(memory_mib=64))
spawn = "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; wait"
res["forks"] = run(spawn, limits=Limits(max_processes=16))
res["deadline"] = run("setsid sleep 1000 & sleep 1000", timeout_s=1.5)
left = []
for entry in Path("/proc").iterdir():
    try:
        if f"MARK={mark}".encode() in (entry / "environ").read_bytes().split(b"\\0"):
            left.append(int(entry.name))
    except (OSError, ValueError):
        pass
res["left"] = left
res["state"] = sorted(p.name for p in (sandbox.state / "runs").iterdir())
res["mounts"] = str(sandbox.state) in Path("/proc/self/mountinfo").read_text()
print(json.dumps(res))
"""


def test_the_container_sandbox_runs_rootless_in_the_users_namespace(user: User) -> None:
    tmp = user.home / f"sandbox-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    chown_tree(tmp, user)
    try:
        res = _python(user, _enter(SCENARIO), str(tmp))
        # uid 1000 inside is a subordinate id on the host, never root's or the user's own.
        assert (tmp / "ws" / "w.txt").stat().st_uid == _subordinate(user) + 999
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert res["rootless"] is True
    ran = res["user"]
    assert isinstance(ran, dict) and ran["code"] == 0, ran
    # The spec's user and the image's Python (Debian's 3.11.2, not this process's 3.11.7).
    assert ran["out"].splitlines() == ["1000", "Python 3.11.2", "ok"]
    assert "cannot create /etc/x: Permission denied" in ran["err"]  # uid 1000 may not write /etc
    assert res["owner"] == 1000  # as the namespace sees it
    assert res["layer"]["out"] == "absent\n"  # type: ignore[index]
    proxy = res["proxy"]
    assert isinstance(proxy, dict) and proxy["code"] == 0, proxy
    assert proxy["out"].splitlines() == ["blocked", "proxied"]
    # Limits without a cgroup: the address space and the process count, per process.
    memory = res["memory"]
    assert isinstance(memory, dict) and memory["code"] != 0 and "MemoryError" in memory["err"]
    assert memory["ooms"] is None  # no cgroup counts it: said, not guessed
    forks = res["forks"]
    assert isinstance(forks, dict) and forks["code"] != 0
    assert "Cannot fork" in forks["err"]
    assert res["deadline"]["outcome"] == "timed_out"  # type: ignore[index]
    assert res["left"] == [] and res["state"] == [] and res["mounts"] is False


def _subordinate(user: User) -> int:
    for line in Path("/etc/subuid").read_text().splitlines():
        name, start, _ = line.split(":")
        if name == user.name:
            return int(start)
    raise AssertionError(f"no /etc/subuid range for {user.name}")


def _openforge_as(
    user: User, out: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/openforge ARGS`` as the user types it from the checkout; ``out`` removed."""
    try:
        return run_as(
            user, [".venv/bin/openforge", *args], ROOT, {"COLUMNS": "400", **env}, [ROOT / ".venv"]
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_tasks_check_builds_and_runs_a_non_root_image_as_a_non_root_user(user: User) -> None:
    out = user.home / f"check-{uuid.uuid4().hex[:8]}"
    done = _openforge_as(
        user, out, ["tasks", "check", "examples/images/run-as-user", "--out", str(out)], {}
    )
    said = " ".join((done.stdout + done.stderr).replace("│", " ").split())  # the table unwrapped
    assert done.returncode == 0, said[-4000:]
    # Built in the user's own store, run in a container (not bubblewrap), oracle 1: the verifier
    # checks the answer was written by the image's uid 1000 "worker".
    assert "run-as-user" in said and "container" in said and "1.000" in said, said
    assert "user worker" in said and "python:3.12-slim -> python:3.11-slim (stand-in)" in said
    assert str(_python(user, _enter(_IDS))["root"]).startswith(f"{user.home}/.cache/openforge/")
    assert not rootless.inside()  # this process was never in it


def test_opted_out_the_reason_is_said_and_bubblewrap_is_the_path(user: User) -> None:
    out = user.home / f"optout-{uuid.uuid4().hex[:8]}"
    done = _openforge_as(
        user,
        out,
        ["tasks", "check", "examples/images/run-as-user", "--out", str(out)],
        {rootless.OPT_OUT: "0"},
    )
    said = done.stdout + done.stderr
    assert "OPENFORGE_ROOTLESS=0 is set" in said and "--sandbox bubblewrap" in said, said


def test_the_namespace_maps_the_users_own_ranges(tmp_path: Path) -> None:
    table = tmp_path / "subuid"
    table.write_text("someone:200000:65536\nbad:line\n1234:300000:1000\n")
    assert rootless._range(table, "someone", 1) == rootless.IdRange(200000, 65536)
    assert rootless._range(table, "other", 1234) == rootless.IdRange(300000, 1000)  # by uid
    assert rootless._range(table, "other", 99) is None
    assert rootless._range(tmp_path / "missing", "someone", 1) is None


def test_without_a_cgroup_rlimits_stand_in_for_the_limits(tmp_path: Path) -> None:
    from infra.sandbox import Limits, RootFs, SandboxSpec
    from infra.sandbox.runc_spec import runtime_spec

    def spec(uid: int) -> SandboxSpec:
        return SandboxSpec(
            argv=("true",),
            stdout=tmp_path / "o",
            stderr=tmp_path / "e",
            root=RootFs(tmp_path, uid, uid),
            limits=Limits(memory_mib=64, max_processes=16),
        )

    worker = runtime_spec(spec(1000), "x", tmp_path, None, tmp_path / "pid", False)
    assert "cgroupsPath" not in worker["linux"] and "resources" not in worker["linux"]
    assert worker["process"]["rlimits"] == [
        {"type": "RLIMIT_AS", "soft": 64 * 2**20, "hard": 64 * 2**20},
        {"type": "RLIMIT_NPROC", "soft": 16, "hard": 16},
    ]
    # uid 0 inside is the user on the host: a process limit would count all of the user's own.
    root = runtime_spec(spec(0), "x", tmp_path, None, tmp_path / "pid", False)
    assert [r["type"] for r in root["process"]["rlimits"]] == ["RLIMIT_AS"]
    limited = runtime_spec(spec(0), "x", tmp_path, "/openforge/x", tmp_path / "pid", False)
    assert limited["linux"]["cgroupsPath"] == "/openforge/x" and "rlimits" not in limited["process"]
