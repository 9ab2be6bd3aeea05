#!/usr/bin/env bash
# Reference solution of echo-world.
set -euo pipefail
echo world > answer.txt
