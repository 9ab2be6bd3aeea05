#!/usr/bin/env bash
# Reference solution of echo-other.
set -euo pipefail
echo other > answer.txt
