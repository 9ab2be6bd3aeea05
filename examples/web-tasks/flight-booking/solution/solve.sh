#!/usr/bin/env bash
# Reference solution: a scripted browser run (solve.py) with the same driver as the browser
# agent (browser_cdp.py).
set -euo pipefail
python3 "$(dirname "$0")/solve.py"
