"""Write the echo-words task set: one Harbor task per word, a train and a held-out split.

    python examples/echo-words/generate.py      # rewrites the task directories and manifest.toml

Each task asks the agent to write one word into ``/app/answer.txt``; its verifier gives reward 1
when the file holds exactly that word, else 0. The word is in the instruction, so the reward
depends on the prompt: a policy that always writes the same word scores 1/len(words) on average.
Held-out tasks use words that no training task uses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = [
    "water", "python", "code", "file", "data", "world", "value", "error",
    "list", "name", "time", "day", "part", "command", "return", "first",
]  # fmt: skip
HELDOUT = ["read", "long", "come", "made", "look", "two", "other", "about"]

INSTRUCTION = "Write the word {word} to answer.txt.\n"
TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "OpenForge"
difficulty = "easy"
category = "echo-words"
tags = ["files", "shell", "demo"]

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 60.0

[environment]
build_timeout_sec = 60.0
cpus = 1
memory_mb = 1024
storage_mb = 64
allow_internet = false
workdir = "/app"
"""
DOCKERFILE = "FROM python:3.12-slim\nWORKDIR /app\n"
TEST_SH = """\
#!/usr/bin/env bash
# Verifier of echo-{word}: reward 1 if /app/answer.txt holds exactly the word "{word}", else 0.
set -u
mkdir -p /logs/verifier
reward=0
if [ -f /app/answer.txt ] && [ "$(tr -d '[:space:]' < /app/answer.txt)" = "{word}" ]; then
  reward=1
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
"""
SOLVE_SH = """\
#!/usr/bin/env bash
# Reference solution of echo-{word}.
set -euo pipefail
echo {word} > answer.txt
"""


def write_task(root: Path, word: str) -> None:
    task = root / f"echo-{word}"
    shutil.rmtree(task, ignore_errors=True)
    for rel, text, mode in [
        ("task.toml", TASK_TOML, 0o644),
        ("instruction.md", INSTRUCTION.format(word=word), 0o644),
        ("environment/Dockerfile", DOCKERFILE, 0o644),
        ("tests/test.sh", TEST_SH.format(word=word), 0o755),
        ("solution/solve.sh", SOLVE_SH.format(word=word), 0o755),
    ]:
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)


def main() -> None:
    lines = [
        "# The echo-words dataset (written by generate.py): one task per word; held-out words",
        "# are never used by a training task.",
    ]
    for split, words in (("train", TRAIN), ("heldout", HELDOUT)):
        for word in words:
            write_task(HERE, word)
            lines += ["", "[[tasks]]", f'path = "echo-{word}"', f'split = "{split}"']
    (HERE / "manifest.toml").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
