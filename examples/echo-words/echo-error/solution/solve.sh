#!/usr/bin/env bash
# Reference solution of echo-error.
set -euo pipefail
echo error > answer.txt
