"""Write the shared files of the web tasks into each task directory.

    python examples/web-tasks/generate.py          # write them
    python examples/web-tasks/generate.py --check  # exit 1 if a copy is out of date

Each task is self-contained, as Harbor wants (its ``environment/`` is its image's build
context), so the parts they share are copied in from ``kit/``: the image recipe, the small web
framework (``webapp.py``) and the entrypoint that starts the app (``serve.sh``), the verifier's
``test.sh`` (each task's own check is ``tests/check.py``), the solution's ``solve.sh`` (each
task's scripted run is ``solution/solve.py``), and ``task.toml`` with the task's difficulty.
What is each task's own: ``instruction.md``, ``environment/app.py``, ``solution/solve.py`` and
``tests/check.py``.

The browser agent's DevTools driver (``infra/harnesses/browser_cdp.py`` and
``browser_tree.py``), which the solutions drive Chromium with, is not copied here: the manifest
names it in its ``[shared]`` table, and loading the task set copies it into each solution
(``infra/tasks/shared.py``; the copies are ignored by git).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KIT = HERE / "kit"
# The driver the solutions share, from its one source (manifest.toml's [shared] table).
DRIVER = ("browser_cdp.py", "browser_tree.py")

# The tasks in increasing difficulty: name -> (difficulty, split).
TASKS = {
    "newsletter-signup": ("easy", "train"),
    "settings-save": ("easy", "train"),
    "shop-order": ("medium", "train"),
    "profile-login": ("medium", "heldout"),
    "flight-booking": ("hard", "heldout"),
}
EXECUTABLE = {"environment/serve.sh", "tests/test.sh", "solution/solve.sh"}


def files(name: str, difficulty: str) -> dict[str, bytes]:
    """The shared files of task ``name``: path in the task -> content."""
    toml = (KIT / "task.toml").read_text().replace("DIFFICULTY", difficulty)
    return {
        "task.toml": toml.encode(),
        "environment/Dockerfile": (KIT / "Dockerfile").read_bytes(),
        "environment/webapp.py": (KIT / "webapp.py").read_bytes(),
        "environment/serve.sh": (KIT / "serve.sh").read_bytes(),
        "tests/test.sh": (KIT / "test.sh").read_bytes(),
        "solution/solve.sh": (KIT / "solve.sh").read_bytes(),
    }


def manifest() -> bytes:
    lines = [
        "# The web tasks (generate.py): one [[tasks]] entry per task directory, easiest first.",
        "",
    ]
    for name, (_, split) in TASKS.items():
        lines += ["[[tasks]]", f'path = "{name}"', f'split = "{split}"', ""]
    lines += [
        "# The browser agent's driver, which every solution drives Chromium with: copied into each",
        "# task's solution/ when the task set is loaded (not committed; infra/tasks/shared.py).",
        "[shared]",
    ]
    lines += [f'"solution/{n}" = "../../infra/harnesses/{n}"' for n in DRIVER]
    return "\n".join(lines).encode() + b"\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only say what is out of date")
    args = parser.parse_args(argv)
    wanted = {HERE / "manifest.toml": manifest()}
    for name, (difficulty, _) in TASKS.items():
        for rel, content in files(name, difficulty).items():
            wanted[HERE / name / rel] = content
    stale = [p for p, c in wanted.items() if not p.exists() or p.read_bytes() != c]
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(HERE)} (run {Path(__file__).name})")
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(wanted[path])
        rel = path.relative_to(HERE).as_posix()
        if rel.split("/", 1)[-1] in EXECUTABLE:
            path.chmod(0o755)
    print(f"{len(stale)} files written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
