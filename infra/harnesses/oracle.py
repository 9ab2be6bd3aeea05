"""The oracle: runs the task's own solution (``bash /solution/solve.sh``) in the workspace.

No model is called. It is how a task set is checked: the oracle must score 1 on every task
(and doing nothing must score 0). The sandbox mounts the task's ``solution/`` directory at
``/solution``; a local run can point it at the task's directory instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.harnesses.base import Endpoint, Harness, Invocation, Report, RolloutDirs

SOLUTION_MOUNT = Path("/solution")  # where Harbor (and our sandbox) mounts solution/


class Oracle(Harness):
    name = "oracle"
    dialect = None

    def __init__(
        self,
        solution_dir: Path | str = SOLUTION_MOUNT,
        env: Mapping[str, str] | None = None,
        bash: Path | str = "/bin/bash",
    ) -> None:
        self.solution_dir = Path(solution_dir)
        self.env = dict(env or {})  # the task's [solution] env
        self.bash = Path(bash)

    @property
    def version(self) -> str:
        return "1"

    def executable(self) -> Path:
        return self.bash

    def read_only_paths(self) -> list[Path]:
        """Nothing of ours: bash is the sandbox's, and the sandbox mounts the solution."""
        return []

    def bin_dirs(self) -> list[Path]:
        return []

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        """``task`` (the prompt) is not used: the solution knows what to do."""
        env = self.base_env(dirs, endpoint)
        env.update(self.env)
        argv = [str(self.bash), str(self.solution_dir / "solve.sh")]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """The final message is the solution's last line of output."""
        lines = [line for line in stdout.splitlines() if line.strip()]
        return Report(final_message=lines[-1] if lines else None)


class NoOp(Harness):
    """Does nothing and exits 0: the baseline that shows a task's verifier can fail (a task
    whose verifier gives the do-nothing run a reward above 0 is a broken task)."""

    name = "noop"
    dialect = None

    @property
    def version(self) -> str:
        return "1"

    def executable(self) -> Path:
        return Path("/bin/true")

    def read_only_paths(self) -> list[Path]:
        return []

    def bin_dirs(self) -> list[Path]:
        return []

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        return Invocation([str(self.executable())], self.base_env(dirs, endpoint), dirs.workspace)

    def report(self, stdout: str) -> Report:
        return Report()
