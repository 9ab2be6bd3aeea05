"""The warm pool over both real sandbox backends (runc containers of a real image, bubblewrap):
a claimed member runs the rollout as a cold sandbox would, nothing of one rollout reaches the
next, a member that cannot get ready is quarantined, the deadline holds from the claim, and
closing the pool leaves no process, directory or cgroup behind."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.images import ImageStore
from infra.sandbox import (
    BubblewrapSandbox,
    Mount,
    RootFs,
    RuncSandbox,
    SandboxBackend,
    SandboxOutcome,
    SandboxSpec,
    cgroups,
)
from infra.sandbox.warm_member import Member, Shape
from infra.sandbox.warm_pool import WarmPool
from schemas.errors import SandboxError
from tests.openforge.train.checks import processes_mentioning

IMAGE = "localhost/python:3.11-slim"  # made by `scripts/setup images`
SLEEP = f"1{uuid.uuid4().int % 10**6:06d}"  # a sleep's seconds no other test's process has
PRELOAD = ("decimal",)  # not imported by a bare `python -I`: its presence proves the warm path

PROBE = """
import json, os, sys
print(json.dumps({
    "preloaded": "decimal" in sys.modules,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items() if k not in ("OPENFORGE_SERVICE_ID",)},
    "workspace": sorted(os.listdir(".")),
    "home": sorted(os.listdir(os.environ["HOME"])),
    "tmp": sorted(os.listdir("/tmp")),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}))
"""


class Setup:
    """One backend, its Python inside the sandbox, and the rollouts' layout under ``tmp``."""

    def __init__(self, backend: SandboxBackend, root: RootFs | None, python: str, tmp: Path):
        self.backend, self.root, self.python, self.tmp = backend, root, python, tmp
        self.pools: list[WarmPool] = []

    def pool(self, size: int = 1, **kw: float) -> WarmPool:
        pool = WarmPool(size, root=self.tmp / f"warm-{len(self.pools)}", **kw)
        self.pools.append(pool)
        return pool

    def rollout(self, name: str, timeout_s: float = 60.0) -> tuple[SandboxSpec, Path]:
        """A cold rollout's spec, its files under ``tmp/name`` (a workspace holding task.txt)."""
        root = self.tmp / name
        (root / "workspace").mkdir(parents=True)
        (root / "home").mkdir()
        (root / "workspace" / "task.txt").write_text(name)
        home = root / "home"
        spec = SandboxSpec(
            argv=(self.python, "-I", str(home / "probe.py")),
            stdout=root / "agent.out",
            stderr=root / "agent.err",
            cwd="/app",
            env={"ROLLOUT": name, "PATH": "/usr/local/bin:/usr/bin:/bin"},
            mounts=(
                Mount(root / "workspace", "/app", read_only=False),
                Mount(home, str(home), read_only=False),
            ),
            home=str(home),
            root=self.root,
            timeout_s=timeout_s,
        )
        return spec, root

    def shape(self, spec: SandboxSpec, root: Path, modules: tuple[str, ...] = PRELOAD) -> Shape:
        shape = Shape.of(spec, root, self.backend, Path(self.python), modules)
        assert shape is not None
        return shape

    def ready_member(self, pool: WarmPool, shape: Shape, timeout: float = 60.0) -> Member:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            member = pool.claim(shape)
            if member is not None:
                return member
            time.sleep(0.05)
        raise AssertionError(f"no member ready in {timeout}s: {pool.stats}")

    def serve(self, name: str, pool: WarmPool) -> tuple[dict, Path, Member]:
        """One rollout through a warm member: the probe's output, the rollout's root, the member."""
        draft, root = self.rollout(name)
        member = self.ready_member(pool, self.shape(draft, root))
        (member.home / "probe.py").write_text(PROBE)
        spec = warm(draft, member, argv=(self.python, "-I", str(member.home / "probe.py")))
        result = member.run(spec, root, root / "home")
        assert result.ok, (result, (root / "agent.err").read_text())
        return json.loads((root / "agent.out").read_text()), root, member


def warm(spec: SandboxSpec, member: Member, **changes: object) -> SandboxSpec:
    """``spec`` with the member's home, as the orchestrator builds it after a claim."""
    mounts = tuple(
        Mount(member.home, str(member.home), read_only=False) if m.inside == spec.home else m
        for m in spec.mounts
    )
    return replace(spec, mounts=mounts, home=str(member.home), **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["runc", "bubblewrap"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Setup]:
    if request.param == "runc":
        store = ImageStore()
        assert store.exists(IMAGE), f"{IMAGE} is missing: run `scripts/setup images`"
        s = Setup(RuncSandbox(), RootFs(store.rootfs(IMAGE)), "/usr/bin/python3", tmp_path)
    else:
        s = Setup(BubblewrapSandbox(), None, "/usr/bin/python3", tmp_path)
    yield s
    for pool in s.pools:
        pool.close()


def test_a_claimed_member_runs_the_rollout_in_the_preloaded_process(setup: Setup) -> None:
    pool = setup.pool()
    out, root, member = setup.serve("first", pool)
    assert out["preloaded"], "the script did not run in the stand-by process"
    assert out["argv"] == [str(member.home / "probe.py")]
    assert out["cwd"] == "/app" and out["workspace"] == ["task.txt"]
    assert out["env"]["ROLLOUT"] == "first" and out["env"]["HOME"] == str(member.home)
    assert ".openforge-warm" not in out["home"], "the pool's control files reached the rollout"
    # everything went back to the attempt's directories; the member's directory is gone
    assert (root / "workspace" / "task.txt").read_text() == "first"
    assert (root / "home" / "probe.py").exists() and not member.dir.exists()
    assert pool.stats.served == 1


def test_a_command_of_another_program_is_exec_d(setup: Setup) -> None:
    pool = setup.pool()
    draft, root = setup.rollout("exec")
    member = setup.ready_member(pool, setup.shape(draft, root))
    spec = warm(draft, member, argv=("/bin/sh", "-c", 'echo "$ROLLOUT in $PWD"; exit 7'))
    result = member.run(spec, root, root / "home")
    assert result.outcome is SandboxOutcome.EXITED and result.exit_code == 7
    assert (root / "agent.out").read_text() == "exec in /app\n"
    assert result.start_s is not None and result.start_s < 1.0


def test_nothing_of_one_rollout_reaches_the_next(setup: Setup) -> None:
    pool = setup.pool(size=2)
    leak = (
        "import os, subprocess;"
        "open('/tmp/leak', 'w').write('x'); open(os.environ['HOME'] + '/leak', 'w').write('x');"
        "open('leak', 'w').write('x');"
        f"subprocess.Popen(['sleep', '{SLEEP}'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    draft, root = setup.rollout("a")
    member = setup.ready_member(pool, setup.shape(draft, root))
    spec = warm(
        draft, member, argv=(setup.python, "-I", "-c", leak), env={**draft.env, "SECRET_OF_A": "1"}
    )
    assert member.run(spec, root, root / "home").ok
    assert (root / "workspace" / "leak").exists()  # A's own files are A's
    out, _, second = setup.serve("b", pool)
    assert second.dir != member.dir
    assert out["workspace"] == ["task.txt"] and "leak" not in out["home"]
    assert "leak" not in out["tmp"] and "SECRET_OF_A" not in out["env"]
    assert len(out["pids"]) <= 2, f"processes of another rollout are visible: {out['pids']}"
    assert not processes_mentioning(f"sleep {SLEEP}"), "A's background process outlived it"


def test_a_member_that_cannot_get_ready_is_quarantined_and_never_served(setup: Setup) -> None:
    pool = setup.pool(size=1)
    draft, root = setup.rollout("broken")
    shape = setup.shape(draft, root, modules=("no_such_module_for_openforge",))
    deadline = time.monotonic() + 60
    while pool.stats.quarantined < 2 and time.monotonic() < deadline:
        assert pool.claim(shape) is None
        time.sleep(0.1)
    assert pool.stats.quarantined >= 2 and pool.stats.served == 0
    time.sleep(1.0)  # a shape whose members fail is retried with a growing pause, not in a loop
    assert pool.stats.started <= 5, pool.stats
    # a member of another image is not served for this one either
    other = replace(setup.shape(draft, root), root=RootFs(Path("/nonexistent")))
    assert pool.claim(other) is None


def test_the_deadline_counts_from_the_claim_and_kills_everything(setup: Setup) -> None:
    pool = setup.pool()
    draft, root = setup.rollout("slow", timeout_s=1.0)
    member = setup.ready_member(pool, setup.shape(draft, root))
    time.sleep(1.5)  # idle time before the claim does not count against the rollout
    spec = warm(draft, member, argv=("/bin/sh", "-c", f"sleep {SLEEP} & sleep {SLEEP}"))
    start = time.monotonic()
    result = member.run(spec, root, root / "home")
    assert result.outcome is SandboxOutcome.TIMED_OUT and result.exit_code is None
    assert 0.9 <= time.monotonic() - start < 15
    assert not processes_mentioning(f"sleep {SLEEP}")


def test_closing_the_pool_leaves_nothing_behind(setup: Setup) -> None:
    pool = setup.pool(size=2)
    draft, root = setup.rollout("idle")
    shape = setup.shape(draft, root)
    assert pool.claim(shape) is None  # asks for the shape: two members start
    deadline = time.monotonic() + 60
    while pool.idle() < 2 or not processes_mentioning(str(pool._directory())):
        assert time.monotonic() < deadline, pool.stats
        time.sleep(0.1)
    where = str(pool._directory())
    members = [m for ms in pool._members.values() for m in ms]
    pool.close()
    assert not processes_mentioning(where), "a member's process outlived the pool"
    assert not Path(where).exists() or not any(Path(where).iterdir())
    if isinstance(setup.backend, RuncSandbox):
        for member in members:
            assert member.result is not None  # its sandbox ended, as the backend reports it
            cid = member.result.sandbox_id.rsplit(".", 1)[1]
            for controller in ("memory", "pids", "cpu"):
                group = cgroups._own_group(controller) / "openforge" / cid
                assert not group.exists(), group
            assert not (setup.backend.state / "runs" / cid).exists()


def test_a_spec_of_another_shape_is_refused(setup: Setup) -> None:
    pool = setup.pool()
    draft, root = setup.rollout("shape")
    member = setup.ready_member(pool, setup.shape(draft, root))
    wrong = warm(draft, member, cwd="/")
    with pytest.raises(Exception, match="another shape"):
        member.run(wrong, root, root / "home")
    member.discard()


def test_members_are_keyed_by_their_image(tmp_path: Path) -> None:
    a, b = RootFs(tmp_path / "a"), RootFs(tmp_path / "b")
    spec = SandboxSpec(argv=("true",), stdout=tmp_path / "o", stderr=tmp_path / "e", root=a)
    backend = BubblewrapSandbox()
    shape_a = Shape.of(spec, tmp_path, backend, Path(sys.executable), ())
    shape_b = Shape.of(replace(spec, root=b), tmp_path, backend, Path(sys.executable), ())
    assert shape_a is not None and shape_a != shape_b
    collecting = replace(spec, collect=(("/x", tmp_path / "x", ()),))
    assert Shape.of(collecting, tmp_path, backend, Path(sys.executable), ()) is None


def test_a_member_stands_by_at_the_lowest_cpu_weight_and_runs_at_the_rollouts(
    tmp_path: Path,
) -> None:
    """runc: a member's start takes only the CPU others leave (cpu.shares 2); its claim gives
    it the rollout's weight (the default, 1024) before the command runs."""
    store = ImageStore()
    backend = RuncSandbox()
    setup = Setup(backend, RootFs(store.rootfs(IMAGE)), "/usr/bin/python3", tmp_path)
    pool = setup.pool()
    try:
        draft, root = setup.rollout("weight")
        member = setup.ready_member(pool, setup.shape(draft, root))
        cid = (member.control / "ready").read_text().rsplit(".", 1)[1]
        shares = cgroups.ROOT / "cpu" / backend._cgroup_path(cid).lstrip("/") / "cpu.shares"
        assert shares.read_text().strip() == "2"
        seen: list[str] = []
        spec = warm(draft, member, argv=("/bin/sh", "-c", "sleep 1"))
        runner = threading.Thread(target=lambda: member.run(spec, root, root / "home"))
        runner.start()
        while runner.is_alive():
            with contextlib.suppress(OSError):
                seen.append(shares.read_text().strip())
            time.sleep(0.05)
        assert "1024" in seen and "2" not in seen[1:], seen
    finally:
        pool.close()


def test_a_member_killed_before_its_command_started_is_an_infrastructure_error(
    setup: Setup,
) -> None:
    """Never the agent's failure: the member's sandbox died under it (here: killed from outside
    after it was claimed), so the caller gets a SandboxError, which the local backend turns into
    an infrastructure failure and plays again as a new attempt."""
    pool = setup.pool()
    draft, root = setup.rollout("killed")
    member = setup.ready_member(pool, setup.shape(draft, root))
    member.cancelled.set()  # what a kill from outside does to its sandbox
    assert member.done.wait(30)
    with pytest.raises(SandboxError, match="not ready"):
        member.run(warm(draft, member), root, root / "home")
    assert (root / "workspace" / "task.txt").read_text() == "killed"  # its files are back
