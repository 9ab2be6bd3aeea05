"""The sandbox faults of :mod:`schemas.faults` (``ROLLOUT_FAULTS``), injected into a rollout's
environment as its agent sees it, without touching the harness.

``command_fails_once``: a bash script in the rollout's home that bash reads before every command
it is given (``BASH_ENV``, which bash honours with ``-c`` and with ``-lc`` alike, and which every
process the harness starts inherits). The first time a bash is given a command in the rollout,
the script claims the fault (``mkdir``, atomic: one shell wins, also among concurrent ones),
keeps the command, says ``Resource temporarily unavailable`` on stderr and exits 126 before the
command runs; every later command runs as it would. It fires on whichever command comes first,
the model's or one the harness runs for itself (what it hit is recorded: the audit tells them
apart). It does not reach a POSIX ``sh -c`` (dash reads no ``BASH_ENV``). The same files work in
every sandbox whose home is the rollout's own directory (bubblewrap, containers).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from schemas.faults import FaultKind, SandboxFault

DIR = ".openforge-fault"  # under the rollout's home
EXIT_CODE = 126  # bash's "found but cannot run"

_SCRIPT = """\
# OpenForge: an injected sandbox fault (command_fails_once, issue 53). Bash reads this file
# (BASH_ENV) before each command it is given: the rollout's first command fails once.
if [ -n "${{BASH_EXECUTION_STRING-}}" ] && mkdir {fired} 2>/dev/null; then
  printf '%s' "$BASH_EXECUTION_STRING" > {fired}/command
  printf 'bash: %s: Resource temporarily unavailable\\n' "${{BASH_EXECUTION_STRING%% *}}" >&2
  exit {exit_code}
fi
"""


def lay_out(kind: FaultKind, home: Path) -> dict[str, str]:
    """Write the files of ``kind`` into the rollout's ``home`` (a host directory the sandbox
    shows at the same path); the environment the agent's sandbox adds for them."""
    if kind is not FaultKind.COMMAND_FAILS_ONCE:
        raise ValueError(f"{kind} is not a sandbox fault")
    root = home / DIR
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o777)  # the image's USER, whoever it is, claims the fault in it
    script = root / "command_fails_once.sh"
    script.write_text(_SCRIPT.format(fired=shlex.quote(str(root / "fired")), exit_code=EXIT_CODE))
    return {"BASH_ENV": str(script)}


def failed(command: str) -> tuple[int, str]:
    """What ``command`` returns when the fault hits it: the exit code and the stderr the script
    writes (the warm start's recovery demonstrations show exactly this)."""
    return EXIT_CODE, f"bash: {command.split(' ')[0]}: Resource temporarily unavailable\n"


def fired(kind: FaultKind, home: Path) -> tuple[SandboxFault, ...]:
    """The fault of ``kind`` that fired in the rollout whose home is ``home`` (empty: it did
    not); when it fired is when the script kept the command."""
    command = home / DIR / "fired" / "command"
    try:
        text = command.read_text(errors="replace")
        at_us = command.stat().st_mtime_ns // 1000
    except OSError:
        return ()
    return (SandboxFault(kind, at_us, text[:2000]),)
