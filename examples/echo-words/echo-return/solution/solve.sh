#!/usr/bin/env bash
# Reference solution of echo-return.
set -euo pipefail
echo return > answer.txt
