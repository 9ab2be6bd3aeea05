"""The oracle: runs the task's own solution (``bash /solution/solve.sh``) in the workspace.

No model is called. It is how a task set is checked: the oracle must score 1 on every task
(and doing nothing must score 0). The sandbox mounts the task's ``solution/`` directory at
``/solution``; a local run can point it at the task's directory instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.harnesses.base import (
    Capabilities,
    Endpoint,
    Invocation,
    Network,
    Report,
    RolloutDirs,
    SystemHarness,
)

SOLUTION_MOUNT = Path("/solution")  # where Harbor (and our sandbox) mounts solution/


class Oracle(SystemHarness):
    name = "oracle"
    capabilities = Capabilities(calls_model=False, network=Network.NONE, runs_solution=True)

    def __init__(
        self,
        solution_dir: Path | str = SOLUTION_MOUNT,
        env: Mapping[str, str] | None = None,
        bash: Path | str = "/bin/bash",
    ) -> None:
        self.solution_dir = Path(solution_dir)
        self.env = dict(env or {})  # the task's [solution] env
        self.program = Path(bash)  # the sandbox mounts the solution itself

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        """``task`` (the prompt) is not used: the solution knows what to do."""
        env = self.base_env(dirs, endpoint)
        env.update(self.env)
        argv = [str(self.program), str(self.solution_dir / "solve.sh")]
        return Invocation(argv, env, dirs.workspace)

    def report(self, stdout: str) -> Report:
        """The final message is the solution's last line of output."""
        lines = [line for line in stdout.splitlines() if line.strip()]
        return Report(final_message=lines[-1] if lines else None)


class NoOp(SystemHarness):
    """Does nothing and exits 0: the baseline that shows a task's verifier can fail (a task
    whose verifier gives the do-nothing run a reward above 0 is a broken task)."""

    name = "noop"
    program = Path("/bin/true")

    def invocation(
        self, task: str, endpoint: Endpoint, dirs: RolloutDirs, timeout_s: float
    ) -> Invocation:
        return Invocation([str(self.executable())], self.base_env(dirs, endpoint), dirs.workspace)

    def report(self, stdout: str) -> Report:
        return Report()
