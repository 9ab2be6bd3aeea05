#!/usr/bin/env bash
# Reference solution of echo-long.
set -euo pipefail
echo long > answer.txt
