#!/usr/bin/env bash
# Reference solution of fix-failing-test; runs in the workspace (/app). The median of an even
# count averages the two middle values, ordered[mid - 1] and ordered[mid].
set -euo pipefail
python3 - <<'PY'
from pathlib import Path

path = Path("textstats/stats.py")
source = path.read_text()
bug = "(ordered[mid] + ordered[mid + 1]) / 2"
assert bug in source, "the bug is not where the solution expects it"
path.write_text(source.replace(bug, "(ordered[mid - 1] + ordered[mid]) / 2"))
PY
python3 -m unittest
echo "fixed median in textstats/stats.py; the tests pass"
