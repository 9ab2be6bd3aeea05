#!/usr/bin/env bash
# Reference solution of echo-two.
set -euo pipefail
echo two > answer.txt
